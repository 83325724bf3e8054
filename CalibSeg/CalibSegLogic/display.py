"""Showing a run's outputs in Slicer's views (needs the Slicer application; not used headless)."""

from __future__ import annotations

__all__ = ["show_outputs", "FOREGROUND_OPACITY"]

# Enough colour to read the confidence map, enough grey to still see the anatomy under it.
FOREGROUND_OPACITY = 0.5


def show_outputs(outputs, input_node) -> None:
    """Input as background, confidence as colour-mapped foreground with its colour legend,
    segments as outlines, and the metrics table and reliability plot in the layout."""
    import slicer

    slicer.util.setSliceViewerLayers(background=input_node, foreground=outputs.confidence,
                                     foregroundOpacity=FOREGROUND_OPACITY, fit=True)
    display = outputs.segmentation.GetDisplayNode()
    if display is not None:
        display.SetVisibility2DFill(False)
        display.SetVisibility2DOutline(True)
    colors_logic = slicer.modules.colors.logic()
    for overlay in (outputs.confidence, outputs.uncertainty):
        legend = colors_logic.AddDefaultColorLegendDisplayNode(overlay)
        legend.SetTitleText(overlay.GetName())
        legend.SetVisibility(overlay is outputs.confidence)
    if outputs.metrics_table is None:
        return
    layout_manager = slicer.app.layoutManager()
    layout_manager.setLayout(slicer.vtkMRMLLayoutNode.SlicerLayoutFourUpPlotTableView)
    selection = slicer.app.applicationLogic().GetSelectionNode()
    selection.SetActiveTableID(outputs.metrics_table.GetID())
    slicer.app.applicationLogic().PropagateTableSelection()
    slicer.modules.plots.logic().ShowChartInLayout(outputs.reliability_chart)
