"""``bundle.json``: :class:`BundleMetadata`, its settings sections and its checks.

:func:`parse_metadata` reads the member's bytes once on load — JSON, the schema version (before
any field is read), the fields, their consistency (:meth:`BundleMetadata.validate`) and the
weights dtype — and raises :class:`BundleError` with one sentence on the first problem.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from CalibSegLib import __version__
from CalibSegLib.bundle.ensemble import MAX_ENSEMBLE_SIZE, Ensemble, EnsembleError, SelectedFrom
from CalibSegLib.input_check.statistics import InputStatistics, InputStatisticsError
from CalibSegLib.interval_rule import IntervalRule, IntervalRuleError
from CalibSegLib.postprocessing import Postprocessing
from CalibSegLib.preprocessing import Preprocessing
from CalibSegLib.quality.model import MIRROR_AGREEMENT, QualityModel, QualityModelError, structure_key
from CalibSegLib.sliding_window import SlidingWindow
from CalibSegLib.terminology import TerminologyError, parse_class_terminology

__all__ = ["SCHEMA_VERSION", "OLDEST_SCHEMA_VERSION", "SINGLE_NETWORK_SCHEMA_VERSION", "MAX_ENSEMBLE_SIZE",
           "METADATA_MEMBER", "STORED_FLOAT_DTYPES", "BundleError", "BundleMetadata", "check_schema_version",
           "parse_metadata", "is_int", "is_number"]

# 3: ensembles (ensemble_size > 1) and input_statistics of version 3, which may hold the network's feature
# statistics; a CalibSeg that reads schema 2 refuses such a bundle in one sentence (update CalibSeg) rather than
# misread it. A bundle needing neither is written as schema 2 (minimal_schema_version), which every CalibSeg
# since resampling by spacing reads.
SCHEMA_VERSION = 3
SINGLE_NETWORK_SCHEMA_VERSION = 2
# Schema 1 bundles resized every slice to a fixed size instead of resampling by spacing; their
# networks expect inputs this CalibSeg no longer produces.
OLDEST_SCHEMA_VERSION = 2
METADATA_MEMBER = "bundle.json"
_MAX_CLASSES = 256  # labels are written as uint8
STORED_FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16}


class BundleError(ValueError):
    """A model bundle is missing, corrupt or incompatible; the message says which and what to do."""


_SECTIONS: dict[str, type] = {
    "preprocessing": Preprocessing, "sliding_window": SlidingWindow, "postprocessing": Postprocessing,
}


def _malformed_ensemble(error: EnsembleError) -> BundleError:
    """The one sentence for a malformed ``ensemble`` section (:mod:`CalibSegLib.bundle.ensemble`'s phrase)."""
    return BundleError(f"The bundle's ensemble is malformed ({error}); rebuild the bundle with calibseg-ensemble or "
                       "python -m Training.sub_ensemble.")


def _check_ensemble_size(ensemble_size: Any) -> None:
    """``ensemble_size`` is a whole number of networks one bundle may hold; :class:`BundleError` otherwise."""
    if not is_int(ensemble_size):
        raise BundleError(f"The bundle's ensemble_size must be an integer, got {ensemble_size!r}.")
    if not 1 <= ensemble_size <= MAX_ENSEMBLE_SIZE:
        raise BundleError(f"The bundle declares ensemble_size={ensemble_size}; an ensemble holds 1 to "
                          f"{MAX_ENSEMBLE_SIZE} networks.")


def _read_ensemble(values: Any, ensemble_size: Any) -> Ensemble:
    """The stored ``ensemble`` section of a bundle of ``ensemble_size`` networks, checked against that size (checked
    first); :class:`BundleError` with one sentence otherwise."""
    _check_ensemble_size(ensemble_size)
    try:
        return Ensemble.from_dict(values, ensemble_size)
    except EnsembleError as error:
        raise _malformed_ensemble(error) from None


def _section(name: str, section_class: type, values: Any) -> Any:
    """One settings section of ``bundle.json`` as its dataclass; :class:`BundleError` on a wrong shape or field."""
    if not isinstance(values, dict):
        raise BundleError(f"{METADATA_MEMBER}'s {name} must be an object, got {values!r}.")
    unknown = sorted(set(values) - {item.name for item in dataclasses.fields(section_class)})
    if unknown:
        raise BundleError(f"{METADATA_MEMBER}'s {name} has unknown field(s) {', '.join(unknown)}.")
    return section_class(**values)


@dataclass
class BundleMetadata:
    """Everything ``bundle.json`` records (see the module docstring).

    ``class_colors`` are RGB in [0, 1]; ``temperature`` is one positive number or one per
    class; ``training`` holds method, loss hyper-parameters, epochs, lr, batch size, seed and
    (for CRaC) the multipliers; ``data`` the dataset, split file and case ids;
    ``quality_model`` the predicted-Dice model fitted on the validation cases
    (:meth:`CalibSegLib.quality.QualityModel.to_dict`), None in bundles without one;
    ``class_terminology`` the standard codes of the foreground classes
    (:func:`CalibSegLib.terminology.parse_class_terminology`) and ``input_statistics`` what the
    training inputs looked like (:meth:`CalibSegLib.input_check.InputStatistics.to_dict`), None
    where absent; ``channel_names`` the input channels in the order the network takes them (a ``dataset.json``'s;
    None: one channel, the image); ``ensemble_size`` how many networks of the declared kind the weights hold (1:
    one network; more: an ensemble whose probabilities are averaged, its members' weights ``members.<m>.…``) and
    ``ensemble`` where they came from (:class:`CalibSegLib.bundle.ensemble.Ensemble`: the folds, their validation
    patients and temperatures, a sub-ensemble's origin; None for one network);
    ``function_intervals`` the interval rule of cardiac function (:class:`CalibSegLib.interval_rule.IntervalRule`,
    fitted by ``python -m Evaluation.function_intervals``), None where none was fitted. The
    library version, weights dtype and checksum are filled in by :func:`save_bundle`.
    """

    network: str
    network_kwargs: dict[str, Any]
    in_channels: int
    num_classes: int
    spatial_dims: int
    class_names: list[str]
    class_colors: list[tuple[float, float, float]]
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    sliding_window: SlidingWindow = field(default_factory=SlidingWindow)
    postprocessing: Postprocessing = field(default_factory=Postprocessing)
    training: dict[str, Any] = field(default_factory=dict)
    temperature: float | list[float] = 1.0
    data: dict[str, Any] = field(default_factory=dict)
    validation_metrics: dict[str, Any] = field(default_factory=dict)
    test_metrics: dict[str, Any] = field(default_factory=dict)
    quality_model: dict[str, Any] | None = None
    class_terminology: dict[str, Any] | None = None
    input_statistics: dict[str, Any] | None = None
    channel_names: list[str] | None = None
    ensemble_size: int = 1
    ensemble: Ensemble | None = None
    function_intervals: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION
    library_version: str = __version__
    weights_dtype: str = "float32"
    weights_sha256: str = ""

    def to_json(self) -> str:
        """``bundle.json`` text; tensors, arrays and tuples in the free-form sections become lists, the ensemble
        its stored form (:meth:`~CalibSegLib.bundle.ensemble.Ensemble.to_dict`: no ``selected_from`` where None)."""
        values = dataclasses.asdict(self)
        values["ensemble"] = None if self.ensemble is None else self.ensemble.to_dict()
        return json.dumps(_plain(values), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BundleMetadata":
        """Metadata from parsed ``bundle.json``; unknown keys (from newer minor writers) are ignored."""
        required = [
            item.name
            for item in dataclasses.fields(cls)
            if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in values]
        if missing:
            raise BundleError(
                f"{METADATA_MEMBER} lacks the required field(s) {', '.join(missing)}; re-export the bundle."
            )
        known = {item.name: values[item.name] for item in dataclasses.fields(cls) if item.name in values}
        for section, section_class in _SECTIONS.items():
            if section in known:
                known[section] = _section(section, section_class, known[section])
        if known.get("ensemble") is not None:
            known["ensemble"] = _read_ensemble(known["ensemble"], known.get("ensemble_size", 1))
        if isinstance(known["class_colors"], list):
            known["class_colors"] = [
                tuple(color) if isinstance(color, list) else color for color in known["class_colors"]
            ]
        return cls(**known)

    @cached_property
    def quality(self) -> QualityModel | None:
        """``quality_model`` parsed, once per metadata object (the summaries read it for every case); None for a
        bundle without one.

        Raises:
            BundleError: the stored model is malformed.
        """
        if self.quality_model is None:
            return None
        try:
            return QualityModel.from_dict(self.quality_model, self.class_names)
        except QualityModelError as error:
            raise BundleError(
                f"The bundle's quality model is malformed ({error}); refit it with calibseg-fit-quality."
            ) from None

    @property
    def minimal_schema_version(self) -> int:
        """The oldest schema that reads this bundle: :data:`SCHEMA_VERSION` for an ensemble or input statistics
        of version 3 (which may hold feature statistics), :data:`SINGLE_NETWORK_SCHEMA_VERSION` otherwise, so an
        older CalibSeg keeps reading what it can."""
        statistics_version = (self.input_statistics or {}).get("version", 1)
        newer = self.ensemble_size > 1 or (is_int(statistics_version) and statistics_version >= 3)
        return SCHEMA_VERSION if newer else SINGLE_NETWORK_SCHEMA_VERSION

    @property
    def selected_from(self) -> SelectedFrom | None:
        """A sub-ensemble's origin (``python -m Training.sub_ensemble``): the ensemble's ``bundle`` name, its
        ``weights_sha256`` and the ``members`` kept, by their numbers there; None for every other bundle."""
        return None if self.ensemble is None else self.ensemble.selected_from

    @property
    def out_of_fold_weights_sha256(self) -> str:
        """The weights whose fold networks made this ensemble's out-of-fold choices: a sub-ensemble's are those of
        the ensemble it keeps members of (:attr:`selected_from`), every other bundle's its own."""
        origin = self.selected_from
        return self.weights_sha256 if origin is None else origin.weights_sha256

    def out_of_fold_member(self, member: int) -> int:
        """Network ``member``'s number among the fold networks of :attr:`out_of_fold_weights_sha256` (what the store
        files their predictions under): a sub-ensemble's in the ensemble it keeps members of (:attr:`selected_from`),
        every other bundle's its own."""
        origin = self.selected_from
        return member if origin is None else origin.members[member]

    def _check_dimensions(self) -> None:
        """A 2D network's target spacing and window are in-plane pairs, a 3D one's (z, y, x) triples."""
        lengths = {"preprocessing's target_spacing": len(self.preprocessing.target_spacing),
                   "sliding_window's patch_size": len(self.sliding_window.patch_size)}
        for name, length in lengths.items():
            if length != self.spatial_dims:
                raise BundleError(
                    f"The bundle's {name} has {length} values but its network is {self.spatial_dims}D; a "
                    f"{self.spatial_dims}D bundle needs {'(z, y, x)' if self.spatial_dims == 3 else '(y, x)'}."
                )

    def validate(self) -> None:
        """Raise :class:`BundleError` when a field has the wrong type or contradicts another.

        The schema version is not checked here: :func:`parse_metadata` checks it once, before any
        field is read, and :func:`~CalibSegLib.bundle.save_bundle` writes the current one.
        """
        if not isinstance(self.network, str) or not isinstance(self.network_kwargs, dict):
            raise BundleError("The bundle's network must be a name and its network_kwargs an object.")
        for name in ("in_channels", "num_classes", "spatial_dims"):
            if not is_int(getattr(self, name)):
                raise BundleError(f"The bundle's {name} must be an integer, got {getattr(self, name)!r}.")
        if (
            self.in_channels < 1
            or not 2 <= self.num_classes <= _MAX_CLASSES
            or self.spatial_dims not in (2, 3)
        ):
            raise BundleError(
                f"The bundle declares in_channels={self.in_channels}, num_classes={self.num_classes}, "
                f"spatial_dims={self.spatial_dims}; need >= 1, 2..{_MAX_CLASSES} and 2 or 3."
            )
        _check_ensemble_size(self.ensemble_size)
        if self.ensemble is not None:
            if not isinstance(self.ensemble, Ensemble):
                raise BundleError("The bundle's ensemble must be an Ensemble object.")
            # Built in memory (calibseg-ensemble, a sub-ensemble), it is held to what a reader accepts: its stored
            # form, read back.
            _read_ensemble(self.ensemble.to_dict(), self.ensemble_size)
        if (
            not isinstance(self.class_names, (list, tuple))
            or not isinstance(self.class_colors, (list, tuple))
            or len(self.class_names) != self.num_classes
            or len(self.class_colors) != self.num_classes
        ):
            raise BundleError(
                f"The bundle declares {self.num_classes} classes but not one name and one colour for each."
            )
        if self.channel_names is not None and (
            not isinstance(self.channel_names, (list, tuple))
            or len(self.channel_names) != self.in_channels
            or not all(isinstance(name, str) and name for name in self.channel_names)
            or len(set(self.channel_names)) != len(self.channel_names)
        ):
            raise BundleError(f"The bundle's channel_names must name each of its {self.in_channels} input channel(s) "
                              f"once, got {self.channel_names!r}.")
        if not all(isinstance(name, str) for name in self.class_names):
            raise BundleError(f"The bundle's class_names must be strings, got {self.class_names!r}.")
        # Summaries, tables and metric rows are keyed by name (spaces as underscores): a name given twice
        # would make one structure vanish from them.
        keys = [structure_key(name) for name in self.class_names]
        repeated = [name for name, key in zip(self.class_names, keys) if keys.count(key) > 1]
        if repeated:
            raise BundleError(f"The bundle's class_names {', '.join(map(repr, dict.fromkeys(repeated)))} name one "
                              "class twice; give every class its own name.")
        if not all(
            isinstance(color, (list, tuple))
            and len(color) == 3
            and all(is_number(value) and 0 <= value <= 1 for value in color)
            for color in self.class_colors
        ):
            raise BundleError(
                f"The bundle's class_colors must be RGB triples in [0, 1], got {self.class_colors!r}."
            )
        for section, section_class in _SECTIONS.items():
            value = getattr(self, section)
            if not isinstance(value, section_class):
                raise BundleError(f"The bundle's {section} must be a {section_class.__name__} object.")
            try:
                value.validate()
            except ValueError as error:
                raise BundleError(f"The bundle's {section} is invalid: {error}") from None
        self._check_dimensions()
        if any(class_id >= self.num_classes for class_id in self.postprocessing.largest_component):
            raise BundleError(
                f"The bundle's postprocessing names class {max(self.postprocessing.largest_component)}, but the "
                f"model has {self.num_classes} classes."
            )
        temperatures = self.temperature if isinstance(self.temperature, (list, tuple)) else [self.temperature]
        if len(temperatures) not in (1, self.num_classes) or not all(
            is_number(value) and math.isfinite(value) and value > 0 for value in temperatures
        ):
            raise BundleError(
                f"The bundle's temperature must be one positive number or one per class, "
                f"got {self.temperature!r}."
            )
        quality = self.quality
        if quality is not None:
            if MIRROR_AGREEMENT in quality.inputs and not self.sliding_window.mirror_axes:
                raise BundleError(
                    f"The bundle's quality model reads {MIRROR_AGREEMENT}, which needs test-time mirroring, but its "
                    f"sliding_window has no mirror_axes; refit it with calibseg-fit-quality."
                )
        if self.class_terminology is not None:
            try:
                parse_class_terminology(self.class_terminology, self.class_names)
            except TerminologyError as error:
                raise BundleError(
                    f"The bundle's class_terminology is malformed ({error}); re-export the bundle."
                ) from None
        if self.input_statistics is not None:
            try:
                InputStatistics.from_dict(self.input_statistics, self.class_names, self.in_channels,
                                          self.ensemble_size)
            except InputStatisticsError as error:
                raise BundleError(
                    f"The bundle's input_statistics are malformed ({error}); refit them with "
                    f"python -m Training.fit_input_check."
                ) from None
        if self.function_intervals is not None:
            try:
                IntervalRule.from_dict(self.function_intervals)
            except IntervalRuleError as error:
                raise BundleError(
                    f"The bundle's function_intervals are malformed ({error}); refit them with "
                    f"python -m Evaluation.function_intervals."
                ) from None


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    """``value`` made JSON-ready: tensors, arrays, tuples → lists; paths → str; NumPy scalars → numbers."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
        return _plain(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


def check_schema_version(version: Any, name: str) -> None:
    """Raise :class:`BundleError` unless ``version`` is a schema this CalibSeg reads (``name`` starts the sentence)."""
    if not is_int(version):
        raise BundleError(f"{name}'s schema_version must be an integer, got {version!r}.")
    if version < OLDEST_SCHEMA_VERSION:
        readable = " to ".join(dict.fromkeys(map(str, (OLDEST_SCHEMA_VERSION, SCHEMA_VERSION))))
        raise BundleError(
            f"{name} uses bundle schema version {version}, from a CalibSeg that resized slices to a fixed size; "
            f"this CalibSeg ({__version__}) resamples by spacing and reads schema {readable}: retrain the model "
            "with calibseg-train."
        )
    if version > SCHEMA_VERSION:
        raise BundleError(
            f"{name} uses bundle schema version {version}, newer than this CalibSeg ({__version__}) reads "
            f"({SCHEMA_VERSION}); update CalibSeg."
        )


def parse_metadata(name: str, raw: bytes) -> BundleMetadata:
    """Checked :class:`BundleMetadata` from ``bundle.json`` bytes (bounded by :data:`_MAX_METADATA_BYTES`)."""
    try:
        values = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:  # ValueError: also over-long integers
        raise BundleError(
            f"{name}'s {METADATA_MEMBER} is not valid JSON ({error}); re-export the bundle."
        ) from None
    if not isinstance(values, dict):
        raise BundleError(f"{name}'s {METADATA_MEMBER} must be a JSON object; re-export the bundle.")
    for required in ("schema_version", "weights_sha256"):
        if required not in values:
            raise BundleError(
                f"{name}'s {METADATA_MEMBER} lacks the required field {required}; re-export the bundle."
            )
    # Before the fields are read: another schema's fields would only give a confusing message.
    check_schema_version(values["schema_version"], name)
    metadata = BundleMetadata.from_dict(values)
    metadata.validate()
    if metadata.weights_dtype not in STORED_FLOAT_DTYPES:
        raise BundleError(
            f"{name}'s weights_dtype {metadata.weights_dtype!r} is not one CalibSeg stores "
            f"({', '.join(STORED_FLOAT_DTYPES)}); re-export the bundle."
        )
    return metadata


def member_metadata(metadata: BundleMetadata) -> BundleMetadata:
    """What one member runs under inside an ensemble described by ``metadata``: its window, temperature and
    post-processing, as a single network without a quality model or input statistics (both describe the ensemble:
    its statistics may hold every member's features, which no single network carries)."""
    return dataclasses.replace(metadata, ensemble_size=1, ensemble=None, quality_model=None, input_statistics=None)
