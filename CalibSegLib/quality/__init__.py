"""Case-level quality from uncertainty: what a reader can act on when there is no reference.

Three parts, one concept:

- **Features** (``features.py``): per predicted structure, from the labels, confidence and
  normalised entropy of a :class:`~CalibSegLib.prediction.Prediction`; the most uncertain slices.
- **Quality model** (``model.py``, its schema; ``fitting.py``): per structure, a predicted Dice
  from the mean of one linear fit per feature — monotone in each, scored on held-out patients
  (:func:`fit_quality_model` on the validation cases, or :func:`fit_from_observations` on any predictions),
  stored as plain numbers in ``bundle.json`` (``BundleMetadata.quality_model``) — with an
  interval and a review threshold.
- **Summary** (``summary.py``, which defines every number a reader sees): the per-structure
  table the CLI writes as ``<case>_summary.json`` and the Slicer module shows. An ensemble whose model was
  fitted on its single fold networks shows the mean of its members' predicted Dice (``members.py``).

Nothing here imports the bundle or the predictor: ``CalibSegLib.bundle`` validates a stored model with the schema,
and the summary and the fitting read a bundle's metadata and run a predictor through the few fields and the one call
they name (:class:`SummaryMetadata`, :class:`CasePredictor`), so the whole package sits below the bundle.
"""

from CalibSegLib.quality.features import HOT_SPOT_LEVEL, MAX_UNCERTAIN_SLICES, structure_features, uncertain_slices
from CalibSegLib.quality.fitting import (CasePredictor, Observation, PredictedClasses, QualityCase, check_references,
                                         fit_from_observations, fit_quality_model, held_out_predictions, observe_cases)
from CalibSegLib.quality.model import (BOUNDARY_RING, FEATURES, INTERVAL_COVERAGE, LOW_CONFIDENCE_THRESHOLD,
                                       MIRROR_AGREEMENT, REVIEW_BELOW, SIZE_FEATURE, UNCERTAINTY_FEATURES,
                                       QualityModel, QualityModelError, StructureQuality, structure_key)
from CalibSegLib.quality.summary import (SummaryMetadata, ensemble_summary_columns, quality_summary, review_sentence,
                                         summary_columns, with_predicted_dice)

__all__ = [
    "LOW_CONFIDENCE_THRESHOLD",
    "HOT_SPOT_LEVEL",
    "REVIEW_BELOW",
    "INTERVAL_COVERAGE",
    "BOUNDARY_RING",
    "MAX_UNCERTAIN_SLICES",
    "FEATURES",
    "UNCERTAINTY_FEATURES",
    "SIZE_FEATURE",
    "MIRROR_AGREEMENT",
    "QualityModelError",
    "StructureQuality",
    "QualityModel",
    "QualityCase",
    "PredictedClasses",
    "CasePredictor",
    "SummaryMetadata",
    "Observation",
    "structure_key",
    "structure_features",
    "uncertain_slices",
    "quality_summary",
    "summary_columns",
    "with_predicted_dice",
    "ensemble_summary_columns",
    "review_sentence",
    "check_references",
    "observe_cases",
    "fit_from_observations",
    "held_out_predictions",
    "fit_quality_model",
]
