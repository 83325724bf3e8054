"""Showing a run's outputs in Slicer's views (needs the Slicer application; not used headless)."""

from __future__ import annotations

__all__ = ["show_outputs", "FOREGROUND_OPACITY"]

# The hot-spot overlay is transparent below its level; where it shows, a little anatomy still shows through.
FOREGROUND_OPACITY = 0.8


def show_outputs(outputs, input_node) -> None:
    """Input as background, the uncertainty hot spots as foreground with their colour legend,
    segments as outlines, the quality table (and with a reference the reliability plot) in the layout."""
    import slicer

    slicer.util.setSliceViewerLayers(background=input_node, foreground=outputs.uncertainty,
                                     foregroundOpacity=FOREGROUND_OPACITY, fit=True)
    display = outputs.segmentation.GetDisplayNode()
    if display is not None:
        display.SetVisibility2DFill(False)
        display.SetVisibility2DOutline(True)
    colors_logic = slicer.modules.colors.logic()
    for overlay in (outputs.confidence, outputs.uncertainty):
        legend = colors_logic.AddDefaultColorLegendDisplayNode(overlay)
        legend.SetTitleText(overlay.GetName())
        legend.SetVisibility(overlay is outputs.uncertainty)
    layout_manager = slicer.app.layoutManager()
    layout_manager.setLayout(slicer.vtkMRMLLayoutNode.SlicerLayoutFourUpPlotTableView)
    selection = slicer.app.applicationLogic().GetSelectionNode()
    selection.SetActiveTableID(outputs.quality_table.GetID())
    slicer.app.applicationLogic().PropagateTableSelection()
    if outputs.reliability_chart is not None:
        slicer.modules.plots.logic().ShowChartInLayout(outputs.reliability_chart)
