"""MRML volume nodes <-> NumPy arrays, keeping the exact voxel grid (IJK-to-RAS).

Arrays are (k, j, i) = (z, y, x) as ``slicer.util.arrayFromVolume`` returns them; spacing is
given in the same (z, y, x) order in mm. Output nodes copy the input's IJK-to-RAS matrix
(spacing, origin and direction), so they overlay the input voxel for voxel.

Arrays go in and out of nodes through ``slicer.util`` (``arrayFromVolume``, ``addVolumeFromArray``,
``arrayFromSegmentBinaryLabelmap``), which work in the application's scene, ``slicer.mrmlScene``:
the scene of the nodes given here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["volume_array", "volume_spacing", "same_grid", "add_volume_like", "reference_label_array",
           "ijk_to_ras", "slice_center_ras"]


def _util():
    import slicer.util  # imported lazily so that CalibSeg's library code never needs Slicer

    return slicer.util


def volume_array(volume_node) -> np.ndarray:
    """A copy of a scalar volume's voxels as a (z, y, x) array; ValueError unless it is a 3D scalar volume."""
    if volume_node is None or not volume_node.IsA("vtkMRMLScalarVolumeNode"):
        raise ValueError("Select a scalar volume as input.")
    image = _image_data(volume_node)
    if image.GetNumberOfScalarComponents() != 1:
        raise ValueError(f"The volume '{volume_node.GetName()}' has {image.GetNumberOfScalarComponents()} components; "
                         "choose a scalar (single-component) volume.")
    dimensions = image.GetDimensions()
    if sum(size > 1 for size in dimensions) < 3:
        raise ValueError(f"The volume '{volume_node.GetName()}' is {'×'.join(map(str, dimensions))} voxels; "
                         "CalibSeg needs a 3D volume.")
    return np.array(_util().arrayFromVolume(volume_node), copy=True)


def _image_data(volume_node):
    """The ``vtkImageData`` of a volume node; ValueError (one sentence) for no volume or one without voxels."""
    if volume_node is None or not volume_node.IsA("vtkMRMLVolumeNode"):
        raise ValueError("Select a volume.")
    image = volume_node.GetImageData()
    if image is None:
        raise ValueError(f"The volume '{volume_node.GetName()}' holds no image data.")
    return image


def volume_spacing(volume_node) -> tuple[float, float, float]:
    """Voxel size (z, y, x) in mm."""
    return tuple(float(value) for value in reversed(volume_node.GetSpacing()))


def ijk_to_ras(volume_node, ijk) -> np.ndarray:
    """RAS position (mm) of the continuous voxel index ``(i, j, k)`` of a volume node."""
    import vtk

    matrix = vtk.vtkMatrix4x4()
    volume_node.GetIJKToRASMatrix(matrix)
    return np.array(matrix.MultiplyPoint([*(float(value) for value in ijk), 1.0])[:3])


def slice_center_ras(volume_node, index: int, axis: int = 0) -> np.ndarray:
    """RAS position (mm) of the centre of slice ``index`` along array axis ``axis`` (0 = k, 1 = j, 2 = i).

    Raises:
        ValueError: ``volume_node`` holds no image data, or ``index`` is outside the volume along that axis.
    """
    dimensions = _image_data(volume_node).GetDimensions()  # (i, j, k)
    ijk_axis = 2 - axis
    if not 0 <= index < dimensions[ijk_axis]:
        raise ValueError(f"Slice {index} is outside the volume, which has {dimensions[ijk_axis]} slices "
                         "along that axis.")
    ijk = [(size - 1) / 2.0 for size in dimensions]
    ijk[ijk_axis] = float(index)
    return ijk_to_ras(volume_node, ijk)


def same_grid(first, second, tolerance: float = 1e-4) -> bool:
    """True when two volume nodes share dimensions and IJK-to-RAS matrix."""
    import vtk

    if first.GetImageData() is None or second.GetImageData() is None:
        return False
    if first.GetImageData().GetDimensions() != second.GetImageData().GetDimensions():
        return False
    matrices = [vtk.vtkMatrix4x4(), vtk.vtkMatrix4x4()]
    first.GetIJKToRASMatrix(matrices[0])
    second.GetIJKToRASMatrix(matrices[1])
    return all(abs(matrices[0].GetElement(r, c) - matrices[1].GetElement(r, c)) <= tolerance
               for r in range(4) for c in range(4))


def add_volume_like(reference_node, array: np.ndarray, name: str, class_name: str = "vtkMRMLScalarVolumeNode"):
    """Add a new volume node holding ``array`` (z, y, x) on ``reference_node``'s exact grid (its IJK-to-RAS
    matrix), with display nodes, to the scene (``slicer.util.addVolumeFromArray``)."""
    import vtk

    matrix = vtk.vtkMatrix4x4()
    reference_node.GetIJKToRASMatrix(matrix)
    scene = reference_node.GetScene()
    return _util().addVolumeFromArray(np.ascontiguousarray(array), matrix, scene.GenerateUniqueName(name), class_name)


def reference_label_array(reference_node, input_node, class_names: list[str]) -> np.ndarray:
    """Reference labels (z, y, x) int64 on the input's grid from a labelmap or segmentation node.

    Segments map to classes by name (case-insensitive), otherwise by their order. A
    reference on a different grid is refused (resampling a reference silently would change
    the metrics it is meant to check).
    """
    if reference_node.IsA("vtkMRMLLabelMapVolumeNode") or reference_node.IsA("vtkMRMLScalarVolumeNode"):
        if not same_grid(reference_node, input_node):
            raise ValueError(f"The reference '{reference_node.GetName()}' is not on the input volume's grid; "
                             "resample it onto the input (Resample Scalar/Vector/DWI Volume) and try again.")
        labels = np.array(_util().arrayFromVolume(reference_node)).astype(np.int64)
    elif reference_node.IsA("vtkMRMLSegmentationNode"):
        labels = _segmentation_labels(reference_node, input_node, class_names)
    else:
        raise ValueError("The reference must be a labelmap volume or a segmentation.")
    if labels.min() < 0 or labels.max() >= len(class_names):
        raise ValueError(f"The reference holds labels outside 0..{len(class_names) - 1}, the model's classes.")
    return labels


def _segmentation_labels(segmentation_node, input_node, class_names: list[str]) -> np.ndarray:
    segmentation = segmentation_node.GetSegmentation()
    lowered = [name.lower() for name in class_names]
    labels = np.zeros(tuple(reversed(input_node.GetImageData().GetDimensions())), dtype=np.int64)
    for order in range(segmentation.GetNumberOfSegments()):
        segment_id = segmentation.GetNthSegmentID(order)
        name = segmentation.GetSegment(segment_id).GetName().lower()
        label = lowered.index(name) if name in lowered else order + 1
        # Exported onto the input's grid through a labelmap that the helper adds and removes again.
        mask = _util().arrayFromSegmentBinaryLabelmap(segmentation_node, segment_id, input_node)
        labels[np.array(mask) > 0] = label
    return labels
