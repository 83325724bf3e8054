"""Stand-ins for the parts of the Slicer application that the ``slicer-core`` package lacks.

slicer-core gives the real MRML library (scene, nodes, segmentation logic) but no running
application: no ``slicer.mrmlScene``, no ``slicer.modules`` and no registered segmentation
converter rules. ``slicer.util``'s segment helpers need those, so tests install them here;
product code never relies on them (it takes the scene from its nodes).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

MODULE_DIR = Path(__file__).resolve().parents[1] / "CalibSeg"
CONVERTER_RULES = ("vtkBinaryLabelmapToClosedSurfaceConversionRule", "vtkClosedSurfaceToBinaryLabelmapConversionRule",
                   "vtkClosedSurfaceToFractionalLabelmapConversionRule",
                   "vtkFractionalLabelmapToClosedSurfaceConversionRule")


def install_standins():
    """Import slicer-core, register the converter rules once and make the module folder importable."""
    slicer = pytest.importorskip("slicer", reason="needs the slicer-core package (pip install slicer-core)")
    if not getattr(slicer, "_calibseg_standins", False):
        factory = slicer.vtkSegmentationConverterFactory.GetInstance()
        for rule in CONVERTER_RULES:
            factory.RegisterConverterRule(getattr(slicer, rule)())
        slicer.modules = types.SimpleNamespace(
            segmentations=types.SimpleNamespace(logic=lambda: slicer.vtkSlicerSegmentationsModuleLogic()))
        slicer._calibseg_standins = True
    if str(MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(MODULE_DIR))
    return slicer


@pytest.fixture
def mrml_scene():
    """A fresh, empty ``vtkMRMLScene``, also published as ``slicer.mrmlScene`` as inside Slicer."""
    slicer = install_standins()
    scene = slicer.vtkMRMLScene()
    colors = slicer.vtkMRMLColorLogic()  # Slicer's default colour tables (grey, labels), as the application adds
    colors.SetMRMLScene(scene)
    colors.AddDefaultColorNodes()
    slicer.mrmlScene = scene
    yield scene
    scene.Clear(1)
    del slicer.mrmlScene
