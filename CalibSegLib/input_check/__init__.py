"""Is this input like the model's training inputs? The statistics a bundle stores and the check against them.

A model's predicted Dice only means something on images like the ones it learnt from: on a
contrast-inverted cine MRI the shipped models predict Dice 0.44–0.51 where 0.01–0.03 is measured.
So before anyone reads a Dice, :func:`check_input` says in plain sentences when an input is unlike
every training volume. Five parts, one concept:

- **Statistics** (``statistics.py``, the stored schema): :class:`InputStatistics`, ``bundle.json``'s
  ``input_statistics``: what the training inputs looked like, and how far from it an input may lie.
- **Observation** (``observation.py``): what is measured on one volume and its label map (:func:`observe_volume`),
  every channel in the units the check compares.
- **Fitting** (``fitting.py``): the statistics from the training volumes and their reference labels
  (:func:`fit_input_statistics`, :func:`statistics_of_cases`), with the network's features (:func:`with_features`).
- **Excursions** (``excursions.py``): how far one volume lies outside the training ranges, per family, and a
  sentence for each family beyond its threshold (:func:`input_reasons`).
- **Check** (``check.py``): a case's ``input_check`` (:func:`check_input`: those sentences, the network's feature
  distance, impossible Hounsfield values) and what a reader sees of it (:func:`input_check_lines`).

Nothing here imports the bundle or the predictor: ``CalibSegLib.bundle`` validates stored statistics with the schema,
and the fitting and the check read a bundle's metadata through the few fields they name (:class:`ObservationMetadata`,
:class:`CheckMetadata`), so the whole package sits below the bundle.
"""

from CalibSegLib.input_check.check import (FEATURES_NOT_MEASURED, FEATURES_NOT_STORED, HOUNSFIELD_RANGE, NOT_CHECKED,
                                           OUTDATED, CheckMetadata, check_input, feature_lines, input_check_lines)
from CalibSegLib.input_check.excursions import RESAMPLING_RANGE, excursions, input_reasons
from CalibSegLib.input_check.fitting import THRESHOLDS, fit_input_statistics, statistics_of_cases, with_features
from CalibSegLib.input_check.observation import (ObservationMetadata, VolumeObservation, check_intensities,
                                                 observe_volume)
from CalibSegLib.input_check.statistics import (FAMILIES, INPUT_STATISTICS_VERSION, QUANTILE_LEVELS, InputStatistics,
                                                InputStatisticsError)

__all__ = ["INPUT_STATISTICS_VERSION", "QUANTILE_LEVELS", "FAMILIES", "InputStatisticsError", "ObservationMetadata",
           "CheckMetadata", "VolumeObservation", "InputStatistics", "check_intensities", "observe_volume",
           "fit_input_statistics", "statistics_of_cases", "THRESHOLDS", "excursions", "input_reasons", "check_input",
           "input_check_lines", "NOT_CHECKED", "OUTDATED", "HOUNSFIELD_RANGE", "RESAMPLING_RANGE",
           "FEATURES_NOT_STORED", "FEATURES_NOT_MEASURED", "feature_lines", "with_features"]
