"""CalibSeg's colour tables: perceptually uniform maps that Slicer does not ship.

Anchors are 17 samples of matplotlib's ``viridis`` (confidence), ``inferno`` (uncertainty) and
``magma`` (an ensemble's disagreement), interpolated linearly to 256 entries; stored here so the module needs
no matplotlib at run time.
"""

from __future__ import annotations

import numpy as np

__all__ = ["COLORMAP_ANCHORS", "colormap_table", "color_table_node"]

COLORMAP_ANCHORS: dict[str, list[tuple[float, float, float]]] = {
    "viridis": [(0.267, 0.005, 0.329), (0.282, 0.095, 0.417), (0.279, 0.175, 0.483), (0.259, 0.252, 0.525),
                (0.230, 0.322, 0.546), (0.199, 0.388, 0.555), (0.173, 0.449, 0.558), (0.149, 0.508, 0.557),
                (0.128, 0.567, 0.551), (0.121, 0.626, 0.533), (0.158, 0.684, 0.502), (0.246, 0.739, 0.452),
                (0.369, 0.789, 0.383), (0.516, 0.831, 0.294), (0.678, 0.864, 0.190), (0.846, 0.887, 0.100),
                (0.993, 0.906, 0.144)],
    "inferno": [(0.001, 0.000, 0.014), (0.042, 0.028, 0.141), (0.129, 0.047, 0.291), (0.238, 0.037, 0.396),
                (0.342, 0.062, 0.429), (0.441, 0.099, 0.432), (0.541, 0.135, 0.415), (0.640, 0.171, 0.381),
                (0.736, 0.216, 0.330), (0.822, 0.275, 0.266), (0.894, 0.353, 0.194), (0.947, 0.449, 0.115),
                (0.978, 0.558, 0.035), (0.988, 0.675, 0.065), (0.975, 0.798, 0.206), (0.948, 0.917, 0.411),
                (0.988, 0.998, 0.645)],
    "magma": [(0.001, 0.000, 0.014), (0.040, 0.031, 0.134), (0.113, 0.065, 0.277), (0.212, 0.062, 0.419),
              (0.317, 0.072, 0.485), (0.415, 0.110, 0.505), (0.513, 0.148, 0.508), (0.614, 0.182, 0.499),
              (0.716, 0.215, 0.475), (0.817, 0.256, 0.436), (0.904, 0.320, 0.388), (0.961, 0.418, 0.360),
              (0.987, 0.536, 0.382), (0.996, 0.654, 0.446), (0.997, 0.770, 0.535), (0.992, 0.884, 0.640),
              (0.987, 0.991, 0.750)],
}


def colormap_table(name: str, size: int = 256) -> np.ndarray:
    """``(size, 3)`` RGB in [0, 1] from the anchors of ``name``."""
    anchors = np.asarray(COLORMAP_ANCHORS[name])
    positions = np.linspace(0, 1, len(anchors))
    samples = np.linspace(0, 1, size)
    return np.stack([np.interp(samples, positions, anchors[:, c]) for c in range(3)], axis=1)


def color_table_node(scene, name: str):
    """The scene's ``CalibSeg <name>`` colour table node, created once and reused."""
    node_name = f"CalibSeg {name}"
    existing = scene.GetFirstNodeByName(node_name)
    if existing is not None and existing.IsA("vtkMRMLColorTableNode"):
        return existing
    import slicer

    node = slicer.vtkMRMLColorTableNode()
    node.SetName(node_name)
    node.SetTypeToUser()
    node.SetAttribute("Category", "CalibSeg")
    table = colormap_table(name)
    node.SetNumberOfColors(len(table))
    for index, (red, green, blue) in enumerate(table):
        node.SetColor(index, f"{index / (len(table) - 1):.3f}", red, green, blue, 1.0)
    scene.AddNode(node)
    return node
