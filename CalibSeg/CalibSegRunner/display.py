"""Showing a run's outputs in Slicer's views (needs the Slicer application; not used headless)."""

from __future__ import annotations

__all__ = ["show_outputs", "show_table", "show_function", "FOREGROUND_OPACITY"]

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
    for overlay in (outputs.confidence, outputs.uncertainty, outputs.disagreement):
        if overlay is None:  # a single network's run has no disagreement
            continue
        legend = colors_logic.AddDefaultColorLegendDisplayNode(overlay)
        legend.SetTitleText(overlay.GetName())
        legend.SetVisibility(overlay is outputs.uncertainty)
    show_table(outputs.quality_table)
    if outputs.reliability_chart is not None:
        slicer.modules.plots.logic().ShowChartInLayout(outputs.reliability_chart)


def show_table(table_node) -> None:
    """The four-up layout with plot and table views, ``table_node`` in the table view (a run's quality table, a
    batch's summary table)."""
    import slicer

    slicer.app.layoutManager().setLayout(slicer.vtkMRMLLayoutNode.SlicerLayoutFourUpPlotTableView)
    selection = slicer.app.applicationLogic().GetSelectionNode()
    selection.SetActiveTableID(table_node.GetID())
    slicer.app.applicationLogic().PropagateTableSelection()


def show_function(outputs) -> None:
    """A cardiac function measurement's table in the layout's table view and, for a cine, its volume curve in the
    plot view."""
    import slicer

    show_table(outputs.table)
    if outputs.chart is not None:
        slicer.modules.plots.logic().ShowChartInLayout(outputs.chart)
