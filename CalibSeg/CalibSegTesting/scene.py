"""What the checks share: the input volumes' grid (anisotropic, off-origin, oblique) and phantom, tiny bundles
with a hand-made quality model or terminology, and readers of the scene (snapshots, table columns, segment IDs)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np

__all__ = ["NUM_CLASSES", "SPACING_XYZ", "ORIGIN", "DIRECTION", "make_volume_node", "ijk_to_ras", "scene_snapshot",
           "phantom", "tiny_bundle", "hand_made_quality_model", "hand_made_terminology", "cardiac_terminology",
           "hand_made_interval_rule", "table_columns",
           "scene_is_unchanged_after", "class_segment_id"]

NUM_CLASSES = 4
# Anisotropic voxels (x, y, z mm, Slicer's order), an off-origin corner and an oblique direction.
SPACING_XYZ = (1.25, 0.8, 6.0)
ORIGIN = (-31.0, 12.5, 40.0)
ANGLE = math.radians(25.0)
DIRECTION = ((math.cos(ANGLE), -math.sin(ANGLE), 0.0), (math.sin(ANGLE), math.cos(ANGLE), 0.0), (0.0, 0.0, -1.0))


def make_volume_node(scene, array: np.ndarray, name: str = "input", class_name: str = "vtkMRMLScalarVolumeNode",
                     spacing=SPACING_XYZ, origin=ORIGIN, direction=DIRECTION):
    """Add a volume node holding ``array`` (k, j, i) with the given spacing (x, y, z), origin and direction rows."""
    import slicer
    import vtk

    node = scene.AddNewNodeByClass(class_name, name)
    slicer.util.updateVolumeFromArray(node, array)
    node.SetSpacing(*spacing)
    node.SetOrigin(*origin)
    matrix = vtk.vtkMatrix4x4()
    for row in range(3):
        for column in range(3):
            matrix.SetElement(row, column, direction[row][column])
    node.SetIJKToRASDirectionMatrix(matrix)
    return node


def ijk_to_ras(node) -> np.ndarray:
    import vtk

    matrix = vtk.vtkMatrix4x4()
    node.GetIJKToRASMatrix(matrix)
    return np.array([[matrix.GetElement(row, column) for column in range(4)] for row in range(4)])


def scene_snapshot(scene) -> list[tuple[str, str, str, int]]:
    """Every node's ID, class, name and modification time: equal snapshots mean an untouched scene."""
    nodes = [scene.GetNthNode(index) for index in range(scene.GetNumberOfNodes())]
    return [(node.GetID(), node.GetClassName(), node.GetName() or "", node.GetMTime()) for node in nodes]


def phantom(shape=(6, 48, 40), seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A bright disc ring phantom (k, j, i) and its 4-class label map, so the network output varies in space."""
    rng = np.random.default_rng(seed)
    k, j, i = np.indices(shape)
    radius = np.hypot(j - shape[1] / 2, i - shape[2] / 2)
    labels = np.select([radius < 6, radius < 10, radius < 14], [3, 2, 1], 0).astype(np.uint8)
    image = (labels * 40.0 + rng.normal(0, 10, shape) + k).astype(np.float32)
    return image, labels


def tiny_bundle(work_dir: Path, seed: int = 0, **overrides) -> Path:
    """A tiny untrained UNet bundle of :data:`NUM_CLASSES` classes (``class 1`` ...), the same weights for the same
    ``seed``; ``overrides`` replace metadata fields (e.g. ``quality_model``)."""
    import torch

    from CalibSegLib.bundle import BundleMetadata, save_bundle
    from CalibSegLib.networks import build_network
    from CalibSegLib.sliding_window import SlidingWindow

    metadata = BundleMetadata(**{
        "network": "unet", "network_kwargs": {"channels": [4, 8], "strides": [2], "num_res_units": 0},
        "in_channels": 1, "num_classes": NUM_CLASSES, "spatial_dims": 2,
        "class_names": ["background"] + [f"class {index}" for index in range(1, NUM_CLASSES)],
        "class_colors": [(0.0, 0.0, 0.0)] + [(index / NUM_CLASSES, 0.5, 1.0 - index / NUM_CLASSES)
                                             for index in range(1, NUM_CLASSES)],
        "sliding_window": SlidingWindow(patch_size=(32, 32)), **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        network = build_network(metadata.network, metadata.in_channels, NUM_CLASSES, 2, **metadata.network_kwargs)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    return save_bundle(Path(work_dir) / ("tiny_quality.calibseg" if overrides else "tiny.calibseg"), network, metadata)


def hand_made_quality_model() -> dict:
    """A hand-made quality model: class 1 always predicted Dice 0.5 (flagged), class 2 always 0.95,
    class 3 falling with its mean entropy."""
    from CalibSegLib.quality import QualityModel, StructureQuality

    def line(intercept: float, slope: float) -> StructureQuality:
        return StructureQuality("mean_entropy", "linear", {"intercept": intercept, "slope": slope},
                                (-0.1, 0.1), 0.05, 0.1, 20)

    return QualityModel({"class 1": line(0.5, 0.0), "class 2": line(0.95, 0.0), "class 3": line(1.2, -1.0)}).to_dict()


def hand_made_terminology() -> dict:
    """Hand-made SNOMED CT entries for classes 1 and 2 (class 3 has none): a type alone, and one with a region."""
    def code(value: str, meaning: str) -> dict:
        return {"CodingSchemeDesignator": "SCT", "CodeValue": value, "CodeMeaning": meaning}

    structure = code("123037004", "Anatomical Structure")
    return {"class 1": {"category": structure, "type": code("53085002", "Right ventricle")},
            "class 2": {"category": structure, "type": code("74281007", "Myocardium"),
                        "region": code("87878005", "Left Ventricle")}}


def cardiac_terminology() -> dict:
    """SNOMED CT types of the heart for classes 1-3, in ACDC's order: right ventricle, myocardium, left ventricle (the
    codes cardiac function finds its structures by)."""
    def code(value: str, meaning: str) -> dict:
        return {"CodingSchemeDesignator": "SCT", "CodeValue": value, "CodeMeaning": meaning}

    structure = code("123037004", "Anatomical Structure")
    return {"class 1": {"category": structure, "type": code("53085002", "Right ventricle")},
            "class 2": {"category": structure, "type": code("74281007", "Myocardium")},
            "class 3": {"category": structure, "type": code("87878005", "Left ventricle")}}


def hand_made_interval_rule(half_width: float = 5.0) -> dict:
    """A hand-made interval rule of cardiac function: every index's interval is its label-voxel value ± ``half_width``
    (a constant scale of 1 times a score quantile of ``half_width``)."""
    from CalibSegLib.interval_rule import INDICES, IntervalRule

    return IntervalRule("hard", "constant", {index: half_width for index in INDICES}).to_dict()


def table_columns(table_node) -> dict[str, list]:
    table = table_node.GetTable()
    columns = {}
    for index in range(table.GetNumberOfColumns()):
        column = table.GetColumn(index)
        columns[column.GetName()] = [column.GetValue(row) for row in range(table.GetNumberOfRows())]
    return columns


def scene_is_unchanged_after(scene, action: Callable[[], object], message: str) -> str:
    """Run ``action``, which must raise; return its error text after checking the scene is untouched."""
    before = scene_snapshot(scene)
    try:
        action()
    except Exception as error:  # the check is on the scene, whatever the error's type
        assert scene_snapshot(scene) == before, f"{message}: the scene changed"
        return str(error)
    raise AssertionError(f"{message}: no error was raised")


def class_segment_id(segmentation_node, order: int) -> str:
    return segmentation_node.GetSegmentation().GetNthSegmentID(order - 1)
