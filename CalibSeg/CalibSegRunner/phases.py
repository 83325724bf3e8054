"""The cardiac phases a function measurement reads from the scene: an ED and an ES volume, or a cine.

A cine is a Sequence node of scalar volumes (Slicer loads a multi-phase DICOM series or a 4D NRRD as one; each
item a phase, its index value the phase's time) or a MultiVolume node (MultiVolumeExplorer's: one scalar volume
whose voxels hold one component per frame, the frames' times in its ``MultiVolume.FrameLabels`` attribute). Either
way the phases come out as one ``(T, z, y, x)`` array on one grid, with the trigger times in ms where the node
says them (a sequence indexed in ``ms`` or ``s``, a multi-volume whose frames are identified in ``ms``).

Every refusal is one sentence (ValueError) and reads nothing into the scene: ED and ES on different grids, a cine
of one phase, a cine whose phases lie on different grids, a node that is no cine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .volumes import same_grid, volume_array, volume_spacing

__all__ = ["MULTIVOLUME_FRAMES", "Phases", "ed_es_phases", "cine_phases", "is_cine_node"]

# MultiVolumeExplorer's attributes of a vtkMRMLMultiVolumeNode (the class exists only with that extension).
MULTIVOLUME_FRAMES = "MultiVolume.NumberOfFrames"
_MULTIVOLUME_LABELS = "MultiVolume.FrameLabels"
_MULTIVOLUME_UNITS = "MultiVolume.FrameIdentifyingDICOMTagUnits"
_TIME_UNITS_MS = {"ms": 1.0, "s": 1000.0}  # a sequence's index unit (or a multi-volume's frame unit) → ms


@dataclass
class Phases:
    """The phases to measure: ``images`` ``(T, z, y, x)`` float32 (ED and ES: T = 2, ED first), ``spacing``
    ``(z, y, x)`` mm, ``trigger_times_ms`` ``(T,)`` or None, ``source_node`` the node they were read from (the ED
    volume, the cine), whose scene gets the outputs, named after ``name``; ``cine``: every phase of a cycle (ED and ES
    chosen from them) rather than an ED and an ES volume."""

    images: np.ndarray
    spacing: tuple[float, float, float]
    trigger_times_ms: list[float] | None
    source_node: object
    name: str
    cine: bool


def _grid_text(node) -> str:
    """A volume's grid in words: its voxel counts (x × y × z) and spacing (mm)."""
    dimensions = "×".join(str(size) for size in node.GetImageData().GetDimensions())
    spacing = " × ".join(f"{value:g}" for value in node.GetSpacing())
    return f"{dimensions} voxels of {spacing} mm"


def ed_es_phases(edVolumeNode, esVolumeNode) -> Phases:
    """The ED and ES volumes as two phases; ValueError (one sentence) unless both are 3D scalar volumes on one grid
    (same voxel counts, spacing, origin and direction: a volume is measured voxel by voxel, and two grids would be
    two different hearts' coordinates)."""
    if edVolumeNode is None or esVolumeNode is None:
        raise ValueError("Choose an end-diastolic (ED) and an end-systolic (ES) volume, or a cine.")
    if edVolumeNode.GetID() == esVolumeNode.GetID():
        raise ValueError(f"The volume '{edVolumeNode.GetName()}' is chosen as both ED and ES; choose the two phases' "
                         "own volumes.")
    ed, es = volume_array(edVolumeNode), volume_array(esVolumeNode)
    if not same_grid(edVolumeNode, esVolumeNode):
        raise ValueError(f"The ED volume '{edVolumeNode.GetName()}' ({_grid_text(edVolumeNode)}) and the ES volume "
                         f"'{esVolumeNode.GetName()}' ({_grid_text(esVolumeNode)}) differ in geometry; give two phases "
                         "of one cine series, which share their grid.")
    return Phases(np.stack([ed, es]).astype(np.float32, copy=False), volume_spacing(edVolumeNode), None, edVolumeNode,
                  edVolumeNode.GetName(), cine=False)


def is_cine_node(node) -> bool:
    """True for a Sequence node or a MultiVolume node (by class, or a volume carrying :data:`MULTIVOLUME_FRAMES`)."""
    return node is not None and (node.IsA("vtkMRMLSequenceNode") or node.IsA("vtkMRMLMultiVolumeNode")
                                 or node.GetAttribute(MULTIVOLUME_FRAMES) is not None)


def _times_ms(values: list[str], unit: str | None) -> list[float] | None:
    """Index values as trigger times in ms when ``unit`` is a time unit and every value a number, else None."""
    scale = _TIME_UNITS_MS.get((unit or "").strip().lower())
    if scale is None:
        return None
    try:
        return [float(value) * scale for value in values]
    except ValueError:
        return None


def _sequence_phases(sequence) -> tuple[list[np.ndarray], list, list[float] | None]:
    nodes = [sequence.GetNthDataNode(index) for index in range(sequence.GetNumberOfDataNodes())]
    name = sequence.GetName()
    if any(node is None or not node.IsA("vtkMRMLScalarVolumeNode") for node in nodes):
        raise ValueError(f"The sequence '{name}' holds items that are no scalar volumes; choose a sequence of the "
                         "cine's volumes (one per phase).")
    values = [sequence.GetNthIndexValue(index) for index in range(len(nodes))]
    return [volume_array(node) for node in nodes], nodes, _times_ms(values, sequence.GetIndexUnit())


def _multivolume_phases(node) -> tuple[list[np.ndarray], list, list[float] | None]:
    """A multi-volume's frames (its voxels' components, read from the image data: ``slicer.util.arrayFromVolume``
    knows the components only of the MultiVolume class itself)."""
    import vtk.util.numpy_support

    image = node.GetImageData()
    if image is None:
        raise ValueError(f"The volume '{node.GetName()}' holds no image data.")
    shape = (*reversed(image.GetDimensions()), image.GetNumberOfScalarComponents())
    frames = vtk.util.numpy_support.vtk_to_numpy(image.GetPointData().GetScalars()).reshape(shape)  # (z, y, x, T)
    labels = [label for label in (node.GetAttribute(_MULTIVOLUME_LABELS) or "").split(",") if label.strip()]
    times = _times_ms(labels, node.GetAttribute(_MULTIVOLUME_UNITS)) if len(labels) == shape[-1] else None
    return [np.array(frames[..., index]) for index in range(shape[-1])], [node] * shape[-1], times


def cine_phases(cineNode) -> Phases:
    """Every phase of a cine (a Sequence or MultiVolume node, see the module docstring), in its order.

    Raises:
        ValueError: not a cine, one phase only (ED and ES are two different phases), items that are no 3D scalar
            volumes, or phases on different grids (named, with both grids); one sentence each.
    """
    if not is_cine_node(cineNode):
        raise ValueError("Choose a cine: a sequence of volumes (one per phase) or a multi-volume.")
    name = cineNode.GetName()
    if cineNode.IsA("vtkMRMLSequenceNode"):
        images, nodes, times = _sequence_phases(cineNode)
    else:
        images, nodes, times = _multivolume_phases(cineNode)
    if len(images) < 2:
        raise ValueError(f"The cine '{name}' holds {len(images)} phase{'' if len(images) == 1 else 's'}; cardiac "
                         "function needs the phases of a whole cycle (at least two), so give the multi-phase series, "
                         "or an ED and an ES volume.")
    for index, node in enumerate(nodes[1:], start=1):
        if not same_grid(nodes[0], node):
            raise ValueError(f"Phase {index} of the cine '{name}' ({_grid_text(node)}) is not on the grid of its phase "
                             f"0 ({_grid_text(nodes[0])}); every phase of a cine must share one grid.")
    return Phases(np.stack(images).astype(np.float32, copy=False), volume_spacing(nodes[0]), times, cineNode, name,
                  cine=True)
