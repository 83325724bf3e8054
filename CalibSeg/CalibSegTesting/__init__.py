"""Test bodies of the CalibSeg module, shared by pytest (slicer-core scene) and CalibSegTest (inside Slicer)."""

from .checks import CHECKS, make_volume_node, scene_snapshot

__all__ = ["CHECKS", "make_volume_node", "scene_snapshot"]
