"""Offscreen picture of what the module shows in a slice view, made with Slicer's own slice pipeline.

``vtkMRMLSliceLogic`` reslices and blends the layers exactly as a Slicer slice view does:
input as background, the confidence map as foreground (CalibSeg's viridis table, 50 %
opacity) and the predicted segmentation as a label layer drawn as outlines. Matplotlib adds
the colour legend (confidence scale and class colours) around that image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from CalibSegLogic.colors import colormap_table
from CalibSegLogic.display import FOREGROUND_OPACITY

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


def _blended_slice(scene, background, foreground, labelmap, size: int, slice_index: int) -> np.ndarray:
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
    producer = slice_logic.GetImageDataConnection().GetProducer()
    producer.Update()
    image = producer.GetOutputDataObject(0)
    width, height, _ = image.GetDimensions()
    rgba = vtk_to_numpy(image.GetPointData().GetScalars()).reshape(height, width, -1)
    return rgba[::-1, :, :3]  # VTK's first row is the bottom one


def render_slice_view(scene, input_node, outputs, class_names, class_colors, path: Path, size: int = 480,
                      slice_index: int | None = None, title: str = "") -> tuple[Path, np.ndarray]:
    """Write a PNG of one axial slice: input, confidence colour map, segmentation outlines and legends.

    Returns the PNG's path and the slice view's own ``(size, size, 3)`` uint8 pixels (before the legend).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    import slicer

    from CalibSegLogic.volumes import add_volume_like

    labels = np.zeros(slicer.util.arrayFromVolume(input_node).shape, dtype=np.uint8)
    for order in range(1, len(class_names)):
        segment_id = outputs.segmentation.GetSegmentation().GetSegmentIdBySegmentName(class_names[order])
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation, segment_id, input_node)
        labels[mask > 0] = order
    labelmap = add_volume_like(scene, input_node, labels, "CalibSeg snapshot labels", "vtkMRMLLabelMapVolumeNode")
    labelmap.GetDisplayNode().SetAndObserveColorNodeID(_label_color_table(scene, class_names, class_colors).GetID())
    if slice_index is None:  # the slice with the most foreground shows the most
        slice_index = int(np.argmax((labels > 0).sum(axis=(1, 2))))
    picture = _blended_slice(scene, input_node, outputs.confidence, labelmap, size, slice_index)

    figure, axes = plt.subplots(figsize=(6.4, 5.2), dpi=100)
    axes.imshow(picture)
    axes.set_axis_off()
    if title:
        axes.set_title(title, fontsize=10)
    scale = figure.colorbar(plt.cm.ScalarMappable(cmap=ListedColormap(colormap_table("viridis")),
                                                  norm=plt.Normalize(0, 1)), ax=axes, fraction=0.046, pad=0.02)
    scale.set_label("confidence (max. class probability)")
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
