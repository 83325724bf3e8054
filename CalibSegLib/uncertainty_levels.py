"""The two levels at which a reader is shown where a prediction is unsure: low confidence and hot spots.

Defined here, where importing costs nothing, because the Slicer module's sliders start at them before torch,
scipy and the rest of the library are installed; :mod:`CalibSegLib.quality` uses them for the features and
the summary.
"""

__all__ = ["LOW_CONFIDENCE_THRESHOLD", "HOT_SPOT_LEVEL"]

# Largest class probability below which a voxel is "low confidence" (a quality model may store its own).
LOW_CONFIDENCE_THRESHOLD = 0.6
# Normalised entropy of a 75/25 split between two of four classes: the second class is a real option.
HOT_SPOT_LEVEL = 0.4
