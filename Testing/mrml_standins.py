"""Stand-ins for the parts of the Slicer application that the ``slicer-core`` package lacks.

slicer-core gives the real MRML library (scene, nodes, segmentation logic) and ``slicer.util``
but no running application: no ``slicer.mrmlScene``, no ``slicer.modules``, no registered
segmentation converter rules and no module folders on Python's path. The ``slicer.util`` helpers
the module uses (``addVolumeFromArray``, ``arrayFromSegmentBinaryLabelmap``, ...) work in
``slicer.mrmlScene`` and through the segmentations module's logic, so tests install those here,
as the application has them.
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
    # Slicer puts a scripted module's folder on Python's path ("Additional module paths"), so CalibSeg.py
    # imports CalibSegRunner and CalibSegTesting from beside it; this is the stand-in for that.
    if str(MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(MODULE_DIR))
    return slicer


def new_scene():
    """A fresh ``vtkMRMLScene`` with Slicer's default colour tables (grey, labels), as the application
    makes it, also published as ``slicer.mrmlScene``."""
    slicer = install_standins()
    scene = slicer.vtkMRMLScene()
    colors = slicer.vtkMRMLColorLogic()
    colors.SetMRMLScene(scene)
    colors.AddDefaultColorNodes()
    # The colour logic must live as long as the scene: once it is deleted, volumes lose their grey
    # table and the slice pipeline draws them black.
    scene.calibsegColorLogic = colors
    slicer.mrmlScene = scene
    return scene


@pytest.fixture
def mrml_scene():
    """:func:`new_scene` for one test, cleared afterwards."""
    import slicer

    scene = new_scene()
    yield scene
    scene.Clear(1)
    del slicer.mrmlScene
