"""Model bundles: one ``*.calibseg`` file (a zip) that says everything needed to run a model.

Members (nothing else is allowed):

- ``bundle.json`` — :class:`BundleMetadata`: schema version, network name and kwargs, input
  channels, classes with names and colours, preprocessing, training method and
  hyper-parameters (incl. CRaC multipliers), temperature, data and split, validation and
  test metrics, the optional quality model (:mod:`CalibSegLib.quality`), library version,
  weights dtype and SHA-256 checksum.
- ``weights.safetensors`` — the state dict as plain tensors. Bundles never contain pickles,
  so loading one can never run code.

:func:`load_bundle` checks all of it and raises :class:`BundleError` with one sentence on
anything missing, corrupt or incompatible.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from CalibSegLib import __version__, networks
from CalibSegLib.io import atomic_output
from CalibSegLib.preprocessing import MIN_IN_PLANE, NORMALIZATIONS
from CalibSegLib.quality import QualityModel, QualityModelError

__all__ = [
    "SCHEMA_VERSION",
    "BUNDLE_SUFFIX",
    "BundleError",
    "Preprocessing",
    "BundleMetadata",
    "Bundle",
    "save_bundle",
    "load_bundle",
]

SCHEMA_VERSION = 1
BUNDLE_SUFFIX = ".calibseg"
METADATA_MEMBER = "bundle.json"
WEIGHTS_MEMBER = "weights.safetensors"
_MAX_CLASSES = 256  # labels are written as uint8
# First bytes of what torch.save / pickle.dump write: a zip archive or a pickle protocol marker.
_PICKLE_SIGNATURES = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


class BundleError(ValueError):
    """A model bundle is missing, corrupt or incompatible; the message says which and what to do."""


@dataclass
class Preprocessing:
    """How a volume is turned into network input; inference uses nothing else.

    ``normalization``: ``"percentile"`` clips each volume to ``[min, upper_percentile]`` and
    scales it to [0, 1] (how the ACDC data were prepared); ``"none"`` leaves intensities.
    ``target_size``: in-plane ``(y, x)`` size in voxels the 2D network sees (bilinear resize).
    ``slice_axis``: the array axis 2D networks step along (0 = z).
    """

    normalization: str = "percentile"
    upper_percentile: float = 99.0
    target_size: tuple[int, int] = (224, 224)
    slice_axis: int = 0

    def validate(self) -> None:
        """Raise :class:`BundleError` when a value is out of range."""
        if self.normalization not in NORMALIZATIONS:
            raise BundleError(
                f"The bundle's normalization {self.normalization!r} is unknown; "
                f"known: {', '.join(NORMALIZATIONS)}."
            )
        if not _is_number(self.upper_percentile) or not 0 < self.upper_percentile <= 100:
            raise BundleError(
                f"The bundle's upper_percentile must lie in (0, 100], got {self.upper_percentile!r}."
            )
        size = self.target_size
        if (
            not isinstance(size, (list, tuple))
            or len(size) != 2
            or not all(_is_int(value) and value >= MIN_IN_PLANE for value in size)
        ):
            raise BundleError(
                f"The bundle's target_size must be two integers >= {MIN_IN_PLANE} (y, x), got {list(size)}."
            )
        if not _is_int(self.slice_axis) or self.slice_axis not in (0, 1, 2):
            raise BundleError(f"The bundle's slice_axis must be 0, 1 or 2, got {self.slice_axis!r}.")


@dataclass
class BundleMetadata:
    """Everything ``bundle.json`` records (see the module docstring).

    ``class_colors`` are RGB in [0, 1]; ``temperature`` is one positive number or one per
    class; ``training`` holds method, loss hyper-parameters, epochs, lr, batch size, seed and
    (for CRaC) the multipliers; ``data`` the dataset, split file and case ids;
    ``quality_model`` the predicted-Dice model fitted on the validation cases
    (:meth:`CalibSegLib.quality.QualityModel.to_dict`), None in bundles without one. The library
    version, weights dtype and checksum are filled in by :func:`save_bundle`.
    """

    network: str
    network_kwargs: dict[str, Any]
    in_channels: int
    num_classes: int
    spatial_dims: int
    class_names: list[str]
    class_colors: list[tuple[float, float, float]]
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    training: dict[str, Any] = field(default_factory=dict)
    temperature: float | list[float] = 1.0
    data: dict[str, Any] = field(default_factory=dict)
    validation_metrics: dict[str, Any] = field(default_factory=dict)
    test_metrics: dict[str, Any] = field(default_factory=dict)
    quality_model: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION
    library_version: str = __version__
    weights_dtype: str = "float32"
    weights_sha256: str = ""

    def to_json(self) -> str:
        """``bundle.json`` text; tensors, arrays and tuples in the free-form sections become lists."""
        return json.dumps(_plain(dataclasses.asdict(self)), indent=2, sort_keys=True)

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
        preprocessing = known.get("preprocessing", {})
        if not isinstance(preprocessing, dict):
            raise BundleError(f"{METADATA_MEMBER}'s preprocessing must be an object, got {preprocessing!r}.")
        try:
            known["preprocessing"] = Preprocessing(**preprocessing)
        except TypeError:
            unknown = sorted(set(preprocessing) - {item.name for item in dataclasses.fields(Preprocessing)})
            raise BundleError(
                f"{METADATA_MEMBER}'s preprocessing has unknown field(s) {', '.join(unknown)}."
            ) from None
        if isinstance(known["preprocessing"].target_size, list):
            known["preprocessing"].target_size = tuple(known["preprocessing"].target_size)
        if isinstance(known["class_colors"], list):
            known["class_colors"] = [
                tuple(color) if isinstance(color, list) else color for color in known["class_colors"]
            ]
        return cls(**known)

    def validate(self) -> None:
        """Raise :class:`BundleError` when a field has the wrong type or contradicts another."""
        if not _is_int(self.schema_version):
            raise BundleError(f"The bundle's schema_version must be an integer, got {self.schema_version!r}.")
        if self.schema_version > SCHEMA_VERSION:
            raise BundleError(
                f"The bundle uses schema version {self.schema_version!r}, newer than this CalibSeg "
                f"({__version__}) reads ({SCHEMA_VERSION}); update CalibSeg."
            )
        if not isinstance(self.network, str) or not isinstance(self.network_kwargs, dict):
            raise BundleError("The bundle's network must be a name and its network_kwargs an object.")
        for name in ("in_channels", "num_classes", "spatial_dims"):
            if not _is_int(getattr(self, name)):
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
        if (
            not isinstance(self.class_names, (list, tuple))
            or not isinstance(self.class_colors, (list, tuple))
            or len(self.class_names) != self.num_classes
            or len(self.class_colors) != self.num_classes
        ):
            raise BundleError(
                f"The bundle declares {self.num_classes} classes but not one name and one colour for each."
            )
        if not all(isinstance(name, str) for name in self.class_names):
            raise BundleError(f"The bundle's class_names must be strings, got {self.class_names!r}.")
        if not all(
            isinstance(color, (list, tuple))
            and len(color) == 3
            and all(_is_number(value) and 0 <= value <= 1 for value in color)
            for color in self.class_colors
        ):
            raise BundleError(
                f"The bundle's class_colors must be RGB triples in [0, 1], got {self.class_colors!r}."
            )
        if not isinstance(self.preprocessing, Preprocessing):
            raise BundleError("The bundle's preprocessing must be a Preprocessing object.")
        self.preprocessing.validate()
        temperatures = self.temperature if isinstance(self.temperature, (list, tuple)) else [self.temperature]
        if len(temperatures) not in (1, self.num_classes) or not all(
            _is_number(value) and math.isfinite(value) and value > 0 for value in temperatures
        ):
            raise BundleError(
                f"The bundle's temperature must be one positive number or one per class, "
                f"got {self.temperature!r}."
            )
        if self.quality_model is not None:
            try:
                QualityModel.from_dict(self.quality_model, self.class_names)
            except QualityModelError as error:
                raise BundleError(
                    f"The bundle's quality model is malformed ({error}); refit it with Training/fit_quality.py."
                ) from None


@dataclass
class Bundle:
    """A loaded (or freshly trained) bundle: metadata plus float32 weights.

    ``path`` is the file it was loaded from, None when built in memory.
    """

    metadata: BundleMetadata
    state_dict: dict[str, torch.Tensor]
    path: Path | None = None

    def build_model(self) -> nn.Module:
        """The network with the bundle's weights, in eval mode, on the CPU."""
        model = _build_network(self.metadata)
        model.load_state_dict(self.state_dict)
        return model.eval()


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
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


def _build_network(metadata: BundleMetadata) -> nn.Module:
    """The declared network with random weights; :class:`BundleError` when it cannot be built."""
    try:
        return networks.build_network(
            metadata.network,
            metadata.in_channels,
            metadata.num_classes,
            metadata.spatial_dims,
            **metadata.network_kwargs,
        )
    except KeyError:
        raise BundleError(
            f"The bundle names an unknown network {metadata.network!r}; this CalibSeg knows "
            f"{', '.join(networks.NETWORKS)}."
        ) from None
    except (TypeError, ValueError, AssertionError) as error:
        raise BundleError(
            f"The bundle's network {metadata.network!r} cannot be built from its network_kwargs ({error})."
        ) from None


def _check_weights_fit(metadata: BundleMetadata, state_dict: dict[str, torch.Tensor]) -> None:
    """Raise :class:`BundleError` unless ``state_dict`` has exactly the declared network's keys and shapes."""
    expected = _build_network(metadata).state_dict()
    missing = [name for name in expected if name not in state_dict]
    unexpected = [name for name in state_dict if name not in expected]
    mismatched = [
        f"{name} {tuple(state_dict[name].shape)} vs {tuple(expected[name].shape)}"
        for name in expected
        if name in state_dict and state_dict[name].shape != expected[name].shape
    ]
    problems = [
        f"{label} {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
        for label, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched))
        if names
    ]
    if problems:
        raise BundleError(
            f"The bundle's weights do not fit the declared network {metadata.network!r} "
            f"({'; '.join(problems)})."
        )


def save_bundle(
    path: str | Path,
    model_or_state_dict: nn.Module | dict[str, torch.Tensor],
    metadata: BundleMetadata,
    half: bool = False,
) -> Path:
    """Check and write a bundle atomically (temporary file, then rename); return its path.

    Args:
        path: destination, conventionally ending in ``.calibseg``.
        model_or_state_dict: the trained network or its state dict.
        metadata: written with the library version, weights dtype and SHA-256 checksum filled in.
        half: store floating-point weights as float16 (half the size; loading casts back to float32).

    Raises:
        BundleError: the metadata is invalid or the weights do not fit the declared network;
            nothing is written then.
    """
    path = Path(path)
    state = (
        model_or_state_dict.state_dict()
        if isinstance(model_or_state_dict, nn.Module)
        else model_or_state_dict
    )
    stored_dtype = torch.float16 if half else torch.float32
    # clone(): safetensors refuses tensors sharing storage (tied weights, views).
    tensors = {
        name: (
            tensor.detach().to("cpu", stored_dtype) if tensor.is_floating_point() else tensor.detach().cpu()
        )
        .contiguous()
        .clone()
        for name, tensor in state.items()
    }
    weights = save_safetensors(tensors)
    metadata = dataclasses.replace(
        metadata,
        schema_version=SCHEMA_VERSION,
        library_version=__version__,
        weights_dtype=str(stored_dtype).removeprefix("torch."),
        weights_sha256=hashlib.sha256(weights).hexdigest(),
    )
    metadata.validate()
    _check_weights_fit(metadata, tensors)
    text = metadata.to_json()
    with atomic_output(path) as temporary:
        with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(METADATA_MEMBER, text)
            archive.writestr(WEIGHTS_MEMBER, weights)
    return path


def _read_members(path: Path) -> tuple[bytes, bytes]:
    """``bundle.json`` and weights bytes of the zip at ``path``, refusing anything else in it."""
    if not path.is_file():
        raise BundleError(f"No model bundle at {path}; check the path (bundles end in {BUNDLE_SUFFIX}).")
    if not zipfile.is_zipfile(path):
        raise BundleError(
            f"{path.name} is not a CalibSeg bundle (not a zip file); choose a {BUNDLE_SUFFIX} file."
        )
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
            if METADATA_MEMBER not in members:
                raise BundleError(f"{path.name} has no {METADATA_MEMBER}, so it is not a CalibSeg bundle.")
            others = [name for name in members if name not in (METADATA_MEMBER, WEIGHTS_MEMBER)]
            if others:
                raise BundleError(
                    f"{path.name} contains {', '.join(others)}; bundles may hold only {METADATA_MEMBER} and "
                    f"{WEIGHTS_MEMBER}, and pickled objects are refused because loading them can run code."
                )
            if WEIGHTS_MEMBER not in members:
                raise BundleError(f"{path.name} has no {WEIGHTS_MEMBER}; re-export the bundle.")
            return archive.read(METADATA_MEMBER), archive.read(WEIGHTS_MEMBER)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError) as error:
        raise BundleError(
            f"{path.name} is corrupt or truncated ({error}); re-export or re-download it."
        ) from None


def _parse_metadata(name: str, raw: bytes) -> BundleMetadata:
    try:
        values = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
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
    version = values["schema_version"]
    if _is_int(version) and version > SCHEMA_VERSION:
        raise BundleError(
            f"{name} uses bundle schema version {version}, newer than this CalibSeg ({__version__}) reads "
            f"({SCHEMA_VERSION}); update CalibSeg."
        )
    metadata = BundleMetadata.from_dict(values)
    metadata.validate()
    return metadata


def _is_safetensors(data: bytes) -> bool:
    """Safetensors starts with a little-endian u64 header length followed by that many bytes of JSON."""
    return len(data) >= 9 and data[8:9] == b"{" and 8 + int.from_bytes(data[:8], "little") <= len(data)


def _parse_weights(name: str, weights: bytes) -> dict[str, torch.Tensor]:
    if not _is_safetensors(weights):
        if weights.startswith(_PICKLE_SIGNATURES):
            raise BundleError(
                f"{name}'s weights are a pickle (torch.save) file, which is refused because loading "
                f"it can run code; re-export the bundle with save_bundle."
            )
        raise BundleError(
            f"{name}'s weights are not a safetensors file; re-export the bundle with save_bundle."
        )
    try:
        tensors = load_safetensors(weights)
    except (SafetensorError, ValueError, RuntimeError) as error:
        raise BundleError(
            f"{name}'s weights cannot be read as safetensors ({error}); re-export the bundle."
        ) from None
    return {key: tensor.float() if tensor.is_floating_point() else tensor for key, tensor in tensors.items()}


def load_bundle(path: str | Path) -> Bundle:
    """Read and check a bundle; weights come back as float32 whatever dtype they were stored in.

    Raises:
        BundleError: (one sentence) the file is missing, not a zip, lacks or has extra members
            (pickles are refused), has invalid or incomplete ``bundle.json``, a newer schema
            version, a checksum mismatch, an unknown network, or weights that do not fit it.
    """
    path = Path(path)
    raw_metadata, weights = _read_members(path)
    metadata = _parse_metadata(path.name, raw_metadata)
    if hashlib.sha256(weights).hexdigest() != metadata.weights_sha256:
        raise BundleError(
            f"{path.name}'s weights do not match their checksum; the file is corrupt, re-export it."
        )
    state_dict = _parse_weights(path.name, weights)
    _check_weights_fit(metadata, state_dict)
    return Bundle(metadata=metadata, state_dict=state_dict, path=path)
