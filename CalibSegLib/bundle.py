"""Model bundles: one ``*.calibseg`` file (a zip) that says everything needed to run a model.

Members:
- ``bundle.json`` — :class:`BundleMetadata` (schema version, network and its kwargs, classes
  with colours, preprocessing, training method and hyper-parameters incl. CRaC multipliers,
  temperature, data and split, validation/test metrics, library version, weights checksum).
- ``weights.safetensors`` — the state dict as plain tensors. Bundles never contain pickles,
  so loading one can never run code.

:func:`load_bundle` checks all of it and raises :class:`BundleError` with one sentence on
anything missing, corrupt or incompatible.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from CalibSegLib import __version__
from CalibSegLib.networks import NETWORKS, build_network

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
_METADATA_MEMBER = "bundle.json"
_WEIGHTS_MEMBER = "weights.safetensors"


class BundleError(ValueError):
    """A model bundle is missing, corrupt or incompatible; the message says which and what to do."""


@dataclass
class Preprocessing:
    """How a volume is turned into network input; inference uses nothing else.

    ``normalization``: ``"percentile"`` clips each volume to ``[min, upper_percentile]`` and
    scales it to [0, 1] (how the ACDC data were prepared); ``"none"`` leaves intensities.
    ``target_size``: in-plane ``(y, x)`` size the 2D network sees (bilinear resize).
    ``slice_axis``: the array axis 2D networks step along (0 = z).
    """

    normalization: str = "percentile"
    upper_percentile: float = 99.0
    target_size: tuple[int, int] = (224, 224)
    slice_axis: int = 0


@dataclass
class BundleMetadata:
    """Everything ``bundle.json`` records (see the module docstring)."""

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
    schema_version: int = SCHEMA_VERSION
    library_version: str = __version__
    weights_sha256: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BundleMetadata":
        names = {item.name for item in dataclasses.fields(cls)}
        required = {item.name for item in dataclasses.fields(cls)
                    if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING}
        missing = sorted(required - set(values))
        if missing:
            raise BundleError(f"bundle.json lacks the required field(s) {', '.join(missing)}; re-export the bundle.")
        known = {key: value for key, value in values.items() if key in names}
        preprocessing = dict(known.get("preprocessing", {}))
        if "target_size" in preprocessing:
            preprocessing["target_size"] = tuple(preprocessing["target_size"])
        try:
            known["preprocessing"] = Preprocessing(**preprocessing)
        except TypeError as error:
            raise BundleError(f"bundle.json has an invalid preprocessing section ({error}).") from None
        known["class_colors"] = [tuple(color) for color in known["class_colors"]]
        return cls(**known)

    def validate(self) -> None:
        """Raise :class:`BundleError` when fields contradict each other."""
        if self.schema_version > SCHEMA_VERSION:
            raise BundleError(
                f"This bundle uses schema version {self.schema_version}, newer than this CalibSeg "
                f"({__version__}) reads ({SCHEMA_VERSION}); update CalibSeg."
            )
        if self.network not in NETWORKS:
            raise BundleError(f"The bundle names an unknown network {self.network!r}; known: {', '.join(NETWORKS)}.")
        if len(self.class_names) != self.num_classes or len(self.class_colors) != self.num_classes:
            raise BundleError(
                f"The bundle declares {self.num_classes} classes but {len(self.class_names)} names and "
                f"{len(self.class_colors)} colours; they must match."
            )
        temperatures = self.temperature if isinstance(self.temperature, list) else [self.temperature]
        if len(temperatures) not in (1, self.num_classes) or not all(t > 0 for t in temperatures):
            raise BundleError(f"The bundle's temperature must be positive, one value or one per class; got {self.temperature}.")


@dataclass
class Bundle:
    """A loaded bundle: metadata plus float32 weights."""

    metadata: BundleMetadata
    state_dict: dict[str, torch.Tensor]
    path: Path | None = None

    def build_model(self) -> nn.Module:
        """The network with the bundle's weights, in eval mode."""
        model = _build(self.metadata)
        model.load_state_dict(self.state_dict)
        return model.eval()


def _build(metadata: BundleMetadata) -> nn.Module:
    return build_network(
        metadata.network, metadata.in_channels, metadata.num_classes, metadata.spatial_dims,
        **metadata.network_kwargs,
    )


def _atomic_write_bytes(path: Path, write) -> None:
    """Call ``write(file_object)`` on a temporary file next to ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save_bundle(
    path: str | Path, model_or_state_dict: nn.Module | dict[str, torch.Tensor], metadata: BundleMetadata,
    half: bool = False,
) -> Path:
    """Write a bundle atomically (temporary file, then rename) and return its path.

    Args:
        path: destination, conventionally ending in ``.calibseg``.
        model_or_state_dict: the trained network or its state dict.
        metadata: filled in with the library version and the weights' SHA-256 checksum.
        half: store floating-point weights as float16 (half the size; loading casts back).
    """
    path = Path(path)
    state = model_or_state_dict.state_dict() if isinstance(model_or_state_dict, nn.Module) else model_or_state_dict
    tensors = {}
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        if half and tensor.is_floating_point():
            tensor = tensor.half()
        tensors[name] = tensor.contiguous()
    weights = save_safetensors(tensors)
    metadata = dataclasses.replace(
        metadata, library_version=__version__, weights_sha256=hashlib.sha256(weights).hexdigest(),
        schema_version=SCHEMA_VERSION,
    )
    metadata.validate()
    # Refuse to write weights that the declared network cannot load.
    _check_weights_fit(metadata, {name: tensor.float() if tensor.is_floating_point() else tensor
                                  for name, tensor in tensors.items()})

    def write(handle) -> None:
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(_METADATA_MEMBER, metadata.to_json())
            archive.writestr(_WEIGHTS_MEMBER, weights)

    _atomic_write_bytes(path, write)
    return path


def _check_weights_fit(metadata: BundleMetadata, state_dict: dict[str, torch.Tensor]) -> None:
    try:
        model = _build(metadata)
    except (TypeError, ValueError) as error:
        raise BundleError(f"The bundle's network {metadata.network!r} cannot be built from its kwargs ({error}).") from None
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [name for name in set(expected) & set(state_dict) if expected[name].shape != state_dict[name].shape]
    if missing or unexpected or mismatched:
        detail = "; ".join(
            part for part in (
                f"missing {', '.join(missing[:3])}" if missing else "",
                f"unexpected {', '.join(unexpected[:3])}" if unexpected else "",
                f"wrong shape for {', '.join(sorted(mismatched)[:3])}" if mismatched else "",
            ) if part
        )
        raise BundleError(f"The bundle's weights do not fit the declared network {metadata.network!r} ({detail}).")


def load_bundle(path: str | Path) -> Bundle:
    """Read and check a bundle; raise :class:`BundleError` with one sentence on any problem."""
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"No model bundle at {path}; check the path (bundles end in {BUNDLE_SUFFIX}).")
    if not zipfile.is_zipfile(path):
        raise BundleError(f"{path.name} is not a CalibSeg bundle (not a zip file); choose a {BUNDLE_SUFFIX} file.")
    try:
        with zipfile.ZipFile(path) as archive:
            members = set(archive.namelist())
            if _METADATA_MEMBER not in members:
                raise BundleError(f"{path.name} has no {_METADATA_MEMBER}; it is not a CalibSeg bundle.")
            unexpected = sorted(members - {_METADATA_MEMBER, _WEIGHTS_MEMBER})
            if unexpected:
                raise BundleError(
                    f"{path.name} contains {', '.join(unexpected)}; bundles hold only {_METADATA_MEMBER} and "
                    f"{_WEIGHTS_MEMBER} (pickled objects are refused because they can run code)."
                )
            if _WEIGHTS_MEMBER not in members:
                raise BundleError(f"{path.name} has no {_WEIGHTS_MEMBER}; re-export the bundle.")
            raw_metadata = archive.read(_METADATA_MEMBER)
            weights = archive.read(_WEIGHTS_MEMBER)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise BundleError(f"{path.name} is corrupt or truncated ({error}); re-export or re-download it.") from None
    try:
        values = json.loads(raw_metadata)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BundleError(f"{path.name} has an unreadable {_METADATA_MEMBER} ({error}).") from None
    if not isinstance(values, dict):
        raise BundleError(f"{path.name}'s {_METADATA_MEMBER} must be a JSON object.")
    version = values.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise BundleError(
            f"{path.name} uses schema version {version}, newer than this CalibSeg reads ({SCHEMA_VERSION}); update CalibSeg."
        )
    try:
        metadata = BundleMetadata.from_dict(values)
    except TypeError as error:
        raise BundleError(f"{path.name} has an invalid {_METADATA_MEMBER} ({error}).") from None
    metadata.validate()
    if hashlib.sha256(weights).hexdigest() != metadata.weights_sha256:
        raise BundleError(f"{path.name}'s weights do not match their checksum; the file is corrupt, re-export it.")
    try:
        tensors = load_safetensors(weights)
    except Exception as error:  # safetensors raises its own error types for malformed headers
        raise BundleError(f"{path.name}'s weights cannot be read as safetensors ({error}).") from None
    state_dict = {name: tensor.float() if tensor.is_floating_point() else tensor for name, tensor in tensors.items()}
    _check_weights_fit(metadata, state_dict)
    return Bundle(metadata=metadata, state_dict=state_dict, path=path)
