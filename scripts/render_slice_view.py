"""Offscreen picture of what the module shows in a slice view, made with Slicer's own slice pipeline.

``vtkMRMLSliceLogic`` reslices and blends the layers exactly as a Slicer slice view does:
input as background, the uncertainty hot spots as foreground (normalised entropy with CalibSeg's
inferno table, transparent below the hot-spot level through the display node's threshold) and
the predicted segmentation as a label layer drawn as outlines. Matplotlib adds the colour legend
(the hot-spot part of the uncertainty scale and the class colours) around that image.

Used by ``make_slicer_sample_data.py`` for README's picture and by ``Testing/test_slicer_module.py``;
it needs the module's ``CalibSegRunner`` importable (``Testing/mrml_standins.install_standins``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from CalibSegRunner.colors import colormap_table
from CalibSegRunner.display import FOREGROUND_OPACITY
from CalibSegRunner.volumes import ijk_to_ras

__all__ = ["render_slice_view"]


def _label_color_table(scene, class_names, class_colors):
    import slicer

    table = slicer.vtkMRMLColorTableNode()
    table.SetTypeToUser()
    table.SetNumberOfColors(len(class_names))
    for label, (name, color) in enumerate(zip(class_names, class_colors)):
        table.SetColor(label, name, *color, 0.0 if label == 0 else 1.0)
    scene.AddNode(table)
    return table


def _blended_slice(scene, background, foreground, labelmap, size: int, slice_index: int,
                   focus: tuple[np.ndarray, float] | None = None) -> np.ndarray:
    """The ``(size, size, 3)`` RGB pixels of an axial slice view through k-slice ``slice_index``;
    with ``focus`` (a RAS point on that slice and a field of view in mm) centred there, else the whole volume."""
    import slicer
    from vtk.util.numpy_support import vtk_to_numpy

    application = slicer.vtkMRMLApplicationLogic()
    application.SetMRMLScene(scene)
    slice_logic = slicer.vtkMRMLSliceLogic()
    slice_logic.SetMRMLApplicationLogic(application)
    slice_logic.SetMRMLScene(scene)
    slice_node = slice_logic.AddSliceNode("CalibSegSnapshot")
    slice_node.SetDimensions(size, size, 1)
    slice_node.SetUseLabelOutline(True)
    composite = slice_logic.GetSliceCompositeNode()
    composite.SetBackgroundVolumeID(background.GetID())
    composite.SetForegroundVolumeID(foreground.GetID())
    composite.SetForegroundOpacity(FOREGROUND_OPACITY)
    composite.SetLabelVolumeID(labelmap.GetID())
    composite.SetLabelOpacity(1.0)
    slice_logic.FitSliceToAll()
    bounds = [0.0] * 6
    slice_logic.GetVolumeSliceBounds(background, bounds)
    spacing = slice_logic.GetLowestVolumeSliceSpacing()[2]
    slice_logic.SetSliceOffset(bounds[4] + (slice_index + 0.5) * spacing)
    if focus is not None:
        centre, field_of_view = focus
        slice_node.SetFieldOfView(field_of_view, field_of_view, slice_node.GetFieldOfView()[2])
        slice_node.JumpSliceByCentering(*centre)
    producer = slice_logic.GetImageDataConnection().GetProducer()
    producer.Update()
    image = producer.GetOutputDataObject(0)
    width, height, _ = image.GetDimensions()
    rgba = vtk_to_numpy(image.GetPointData().GetScalars()).reshape(height, width, -1)
    pixels = np.array(rgba[::-1, :, :3])  # VTK's first row is the bottom one
    # The view's nodes go again, so the next picture starts from a fresh view of the requested size.
    scene.RemoveNode(composite)
    scene.RemoveNode(slice_node)
    return pixels


def _focus(input_node, mask: np.ndarray, slice_index: int, zoom: float) -> tuple[np.ndarray, float] | None:
    """Centre (RAS) and field of view (mm) showing ``mask``'s ``(j, i)`` box on a k-slice, ``zoom`` times its size."""
    if not mask.any():
        return None
    rows, columns = np.nonzero(mask)
    spacing = input_node.GetSpacing()  # (i, j, k)
    extent = max((np.ptp(columns) + 1) * spacing[0], (np.ptp(rows) + 1) * spacing[1])
    ijk = ((columns.min() + columns.max()) / 2.0, (rows.min() + rows.max()) / 2.0, float(slice_index))
    return ijk_to_ras(input_node, ijk), zoom * extent


def render_slice_view(scene, input_node, outputs, class_names, class_colors, path: Path, size: int = 480,
                      slice_index: int | None = None, title: str = "", zoom: float | None = None,
                      ) -> tuple[Path, np.ndarray]:
    """Write a PNG of one axial slice: input, uncertainty hot spots, segmentation outlines and legends.

    ``slice_index`` defaults to the run's most uncertain slice (``outputs.summary``), or the slice
    with the most predicted foreground when no slice has a hot spot. ``zoom``: show the predicted
    structures of that slice, the field of view ``zoom`` times their extent, instead of the whole slice.

    Returns the PNG's path and the slice view's own ``(size, size, 3)`` uint8 pixels (before the legend).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    import slicer

    from CalibSegRunner.volumes import add_volume_like

    labels = np.zeros(slicer.util.arrayFromVolume(input_node).shape, dtype=np.uint8)
    for order in range(1, len(class_names)):
        segment_id = outputs.segmentation.GetSegmentation().GetSegmentIdBySegmentName(class_names[order])
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation, segment_id, input_node)
        labels[mask > 0] = order
    labelmap = add_volume_like(input_node, labels, "CalibSeg snapshot labels", "vtkMRMLLabelMapVolumeNode")
    labelmap.GetDisplayNode().SetAndObserveColorNodeID(_label_color_table(scene, class_names, class_colors).GetID())
    if slice_index is None:
        uncertain = outputs.summary["uncertain_slices"]
        slice_index = uncertain[0] if uncertain else int(np.argmax((labels > 0).sum(axis=(1, 2))))
    focus = None if zoom is None else _focus(input_node, labels[slice_index] > 0, slice_index, zoom)
    picture = _blended_slice(scene, input_node, outputs.uncertainty, labelmap, size, slice_index, focus)
    level = outputs.uncertainty.GetDisplayNode().GetLowerThreshold()

    figure, axes = plt.subplots(figsize=(6.4, 5.2), dpi=100)
    axes.imshow(picture)
    axes.set_axis_off()
    if title:
        axes.set_title(title, fontsize=10)
    # Only the part of the 0–1 scale the view can show: below the level the overlay is transparent.
    table = colormap_table("inferno")
    start = min(max(level, 0.0), 0.99)  # a level at or above 1 shows nothing; keep a sliver of scale to draw
    shown = ListedColormap(table[int(round(start * (len(table) - 1))):])
    scale = figure.colorbar(plt.cm.ScalarMappable(cmap=shown, norm=plt.Normalize(start, 1)), ax=axes,
                            fraction=0.046, pad=0.02)
    scale.set_label(f"uncertainty (entropy / log C), hot spots ≥ {level:.2f}")
    axes.legend(handles=[Patch(facecolor="none", edgecolor=color, linewidth=2, label=name)
                         for name, color in zip(class_names[1:], class_colors[1:])],
                loc="lower left", fontsize=8, framealpha=0.8, title="segmentation", title_fontsize=8)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp.png")
    figure.savefig(temporary)
    plt.close(figure)
    temporary.replace(path)
    return path, picture
