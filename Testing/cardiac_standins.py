"""A stand-in predictor for the cardiac-function tests: its "image" is a label map, its prediction that label map
with softened one-hot probabilities, so every volume the tests expect is a count of the input's voxels."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from CalibSegLib.prediction import Prediction
from Datasets.acdc import ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from tiny_bundles import make_test_metadata

__all__ = ["SURE", "LabelPredictor", "cardiac_metadata"]

SURE = 0.8  # the probability of the drawn class; the rest is shared evenly by the others


def cardiac_metadata(**overrides: Any):
    """Tiny-bundle metadata with ACDC's classes and their SNOMED CT codes."""
    return make_test_metadata(class_names=list(ACDC_CLASS_NAMES), class_terminology=ACDC_TERMINOLOGY,
                              **overrides)


class LabelPredictor:
    """Predicts its input label map, with probability :data:`SURE` for the drawn class."""

    def __init__(self, metadata=None) -> None:
        self.metadata = metadata if metadata is not None else cardiac_metadata()
        self.num_classes = self.metadata.num_classes
        self.calls = 0

    def probabilities(self, labels: np.ndarray) -> np.ndarray:
        """``(C, z, y, x)`` float32."""
        others = (1.0 - SURE) / (self.num_classes - 1)
        values = np.full((self.num_classes, *labels.shape), others, np.float32)
        np.put_along_axis(values, labels[None].astype(np.int64), SURE, axis=0)
        return values

    def predict(self, image: np.ndarray, spacing: Sequence[float], progress=None, cancel=None,
                keep_probabilities: bool = False, probability_sink=None) -> Prediction:
        self.calls += 1
        labels = np.asarray(image).astype(np.uint8)
        probabilities = self.probabilities(labels)
        if probability_sink is not None:
            probability_sink(slice(0, labels.shape[0]), probabilities)
        return Prediction(labels=labels, confidence=probabilities.max(axis=0), entropy=np.zeros(labels.shape,
                                                                                                 np.float32))
