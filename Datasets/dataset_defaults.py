"""What a dataset's name implies where its folder says nothing: its classes (names, colours, standard codes), how
its channels are normalised, and what a run's start says about its volumes.

ACDC (``acdc``, ``acdc-sample``) gets ACDC's classes, codes and recipe; any other data gets neutral defaults.
"""

from __future__ import annotations

from typing import Sequence

from Datasets.acdc import ACDC_CLASS_COLORS, ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from Datasets.dataset_names import ACDC_DATASET, SAMPLE_DATASET

__all__ = ["DEFAULT_CLASS_COUNT", "default_classes", "default_terminology", "default_scheme", "volumes_note"]

# Classes, background included, of data whose folder names none (no dataset.json): ACDC's, as the sample's.
DEFAULT_CLASS_COUNT: int = len(ACDC_CLASS_NAMES)


def default_classes(num_classes: int, dataset: str, names: Sequence[str] | None = None,
                    ) -> tuple[list[str], list[tuple[float, float, float]]]:
    """Class names and RGB colours in [0, 1]: ``names`` when given (a ``dataset.json``'s,
    :func:`Datasets.dataset_json.read_dataset_description`), ACDC's for ACDC data (``dataset`` ``acdc`` or
    ``acdc-sample``), else ``class k``; colours from a fixed palette."""
    if names is None and dataset in (ACDC_DATASET, SAMPLE_DATASET) and num_classes == len(ACDC_CLASS_NAMES):
        return list(ACDC_CLASS_NAMES), list(ACDC_CLASS_COLORS)
    names = list(names) if names is not None else ["background"] + [f"class {index}" for index in range(1, num_classes)]
    palette = [(0.90, 0.30, 0.25), (0.30, 0.70, 0.35), (0.25, 0.45, 0.90), (0.95, 0.75, 0.20),
               (0.65, 0.35, 0.80), (0.20, 0.75, 0.80), (0.95, 0.50, 0.70), (0.60, 0.45, 0.25)]
    return names, [(0.0, 0.0, 0.0)] + [palette[(index - 1) % len(palette)] for index in range(1, num_classes)]


def default_terminology(class_names: Sequence[str]) -> dict[str, dict[str, dict[str, str]]] | None:
    """The ``class_terminology`` of a bundle with these classes: :data:`ACDC_TERMINOLOGY` for ACDC's, else None."""
    return ACDC_TERMINOLOGY if list(class_names) == ACDC_CLASS_NAMES else None


def default_scheme(dataset: str) -> str:
    """How a dataset's channels other than CT are normalised per image (training's plan): ``"percentile"`` for
    ACDC (``acdc``, ``acdc-sample``: the recipe the shipped models were trained and measured with; its
    volumes were prepared by that very scaling), ``"zscore"`` for any other data (nnU-Net's choice for MRI: a
    lesion brighter than the image's 99th percentile stays apart from the tissue around it)."""
    return "percentile" if dataset in (ACDC_DATASET, SAMPLE_DATASET) else "zscore"


def volumes_note(dataset: str) -> str:
    """What a run's start says about a dataset's volumes per patient (ACDC: two frames), or ``""``."""
    if dataset in (ACDC_DATASET, SAMPLE_DATASET):
        return " (ACDC has an end-diastole and an end-systole volume per patient)"
    return ""
