"""Fault catalogue, bundles: every hostile or broken ``.calibseg`` is one BundleError sentence, with
bounded resources (nothing declared is allocated before it is checked) and nothing changed on disk."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import save as save_safetensors

from CalibSegLib.bundle import METADATA_MEMBER, WEIGHTS_MEMBER, BundleError, load_bundle
from CalibSegLib.inference import Predictor
from tiny_bundles import make_test_bundle
from fault_checks import (
    FOUR_GIB,
    RawMember,
    assert_one_sentence,
    bundle_declaring_four_gib,
    bundle_parts,
    tree_snapshot,
    write_bundle,
    write_raw_zip,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return make_test_bundle(tmp_path_factory.mktemp("good") / "good.calibseg")


@pytest.fixture(scope="module")
def parts(good) -> tuple[dict, bytes]:
    return bundle_parts(good)


def variant(parts, out: Path, change: Callable[[dict], None] | None = None, weights: bytes | None = None,
            members: list[tuple[str, bytes]] | None = None, checksum: bool = True) -> Path:
    """The good bundle at ``out`` with ``bundle.json`` edited by ``change``, other weights (checksum
    updated unless ``checksum=False``) or another member list."""
    metadata = json.loads(json.dumps(parts[0]))
    if change is not None:
        change(metadata)
    return write_bundle(out, metadata, parts[1] if weights is None else weights, checksum, members)


def state(good: Path) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in load_bundle(good).state_dict.items()}


def with_value(good: Path, value: float, dtype=torch.float32) -> bytes:
    """Safetensors weights of the good bundle with one value of its last tensor set to ``value``."""
    tensors = state(good)
    last = list(tensors)[-1]
    tensors[last].view(-1)[0] = value
    return save_safetensors({name: tensor.to(dtype) for name, tensor in tensors.items()})


def safetensors_with_header(header: dict | bytes, data: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def _header_of(weights: bytes) -> tuple[dict, bytes]:
    size = int.from_bytes(weights[:8], "little")
    return json.loads(weights[8 : 8 + size]), weights[8 + size :]


def overlapping_offsets(weights: bytes) -> bytes:
    header, data = _header_of(weights)
    first, second = sorted(header, key=lambda key: header[key]["data_offsets"])[:2]
    header[second]["data_offsets"] = list(header[first]["data_offsets"])
    return safetensors_with_header(header, data)


def truncated_data(weights: bytes) -> bytes:
    header, data = _header_of(weights)
    return safetensors_with_header(header, data[:-4])


def float64_weights(good: Path) -> bytes:
    return save_safetensors({name: tensor.double() for name, tensor in state(good).items()})


@pytest.fixture(scope="module")
def four_gib_bundle(good, tmp_path_factory) -> Path:
    return bundle_declaring_four_gib(good, tmp_path_factory.mktemp("huge") / "huge.calibseg")


def _raw(member: str = WEIGHTS_MEMBER, **fields) -> Callable:
    """The good bundle written byte by byte, with ``fields`` of :class:`RawMember` replaced in ``member``
    (what its directory entry declares: size, CRC, compression method, flags)."""
    def make(parts, good, folder: Path) -> Path:
        metadata = json.dumps(parts[0]).encode()
        members = {METADATA_MEMBER: RawMember(METADATA_MEMBER, metadata, len(metadata), zlib.crc32(metadata)),
                   WEIGHTS_MEMBER: RawMember(WEIGHTS_MEMBER, parts[1], len(parts[1]), zlib.crc32(parts[1]))}
        for key, value in fields.items():
            setattr(members[member], key, value)
        return write_raw_zip(folder / "raw.calibseg", list(members.values()))

    return make


def _declared(member: str, declared: int, data: bytes = b"{}") -> Callable:
    """``member`` holds ``data`` but its directory entry declares ``declared`` bytes."""
    return _raw(member, data=data, file_size=declared, crc=zlib.crc32(data))


def _many_members(parts, good, folder: Path) -> Path:
    with zipfile.ZipFile(folder / "many.calibseg", "w") as archive:
        for index in range(100):
            archive.writestr(f"junk{index}", b"")
    return folder / "many.calibseg"


def _kwargs(**options) -> Callable:
    return lambda parts, good, folder: variant(
        parts, folder / "kw.calibseg", lambda m: m["network_kwargs"].update(options))


def _field(**fields) -> Callable:
    return lambda parts, good, folder: variant(parts, folder / "field.calibseg", lambda m: m.update(fields))


def _metadata_bytes(raw: bytes) -> Callable:
    return lambda parts, good, folder: variant(
        parts, folder / "json.calibseg", members=[(METADATA_MEMBER, raw), (WEIGHTS_MEMBER, parts[1])])


def _input_statistics(version: int = 3, **features) -> dict:
    """Input statistics of the good bundle's classes with the network's features (fitted on random vectors),
    ``features`` replacing fields of those."""
    import numpy as np

    from CalibSegLib.feature_statistics import fit_feature_statistics
    from CalibSegLib.input_check import THRESHOLDS, fit_input_statistics, observe_volume

    rng = np.random.default_rng(0)
    labels = np.tile(np.arange(4, dtype=np.uint8).repeat(4), (2, 16, 1))  # every class present
    observation = observe_volume(rng.random((2, 16, 16)), (1.0, 1.0, 1.0), labels,
                                 ["background", "class 1", "class 2", "class 3"])
    vectors = [rng.normal(size=(2, 8)) for _ in range(25)]
    statistics = fit_input_statistics([observation], THRESHOLDS).to_dict()
    fitted = fit_feature_statistics("model.1", vectors[:20], vectors[20:])
    statistics["features"] = {**fitted.to_dict(), **features}
    return {**statistics, "version": version}


def _member_statistics(**member_features) -> dict:
    """Version-4 input statistics judged by two members (both the good bundle's network fitted on random vectors),
    ``member_features`` replacing fields of those."""
    from CalibSegLib.feature_statistics import FeatureStatistics, pool_member_statistics

    first = FeatureStatistics.from_dict(_input_statistics()["features"])
    judges = pool_member_statistics([first, first], [[first.threshold], [first.threshold / 2]]).to_dict()
    return {**_input_statistics(version=4), "features": None, "member_features": {**judges, **member_features}}


def _weights(make_weights: Callable[[Path, bytes], bytes], checksum: bool = True) -> Callable:
    return lambda parts, good, folder: variant(
        parts, folder / "w.calibseg", weights=make_weights(good, parts[1]), checksum=checksum)


# case → (make(parts, good, folder) -> path, regexes the sentence must match)
BAD_BUNDLES: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "two bundle.json members": (
        lambda p, g, f: variant(p, f / "dup.calibseg", members=[
            (METADATA_MEMBER, json.dumps(p[0]).encode()), (METADATA_MEMBER, b"{}"), (WEIGHTS_MEMBER, p[1])]),
        ("bundle.json more than once",)),
    "two weights members": (
        lambda p, g, f: variant(p, f / "dup.calibseg", members=[
            (METADATA_MEMBER, json.dumps(p[0]).encode()), (WEIGHTS_MEMBER, p[1]), (WEIGHTS_MEMBER, p[1])]),
        ("weights.safetensors more than once",)),
    "weights declare 4 GiB": (_declared(WEIGHTS_MEMBER, FOUR_GIB), ("declares 4.0 GiB", "refused unread")),
    "weights declare 3 GB": (
        _declared(WEIGHTS_MEMBER, 3_000_000_000), ("declares 2.8 GiB", "refused unread")),
    "weights declare 1.5 GB for a tiny network": (
        _declared(WEIGHTS_MEMBER, 1_500_000_000, b"\x10" + bytes(7) + b"{"),
        ("do not fit the declared network",)),
    "bundle.json declares 2 MB": (_declared(METADATA_MEMBER, 2 << 20), ("bundle.json declares 2.0 MiB",)),
    "zip directory of 100 members": (_many_members, ("lists 100 members", "refused unread")),
    "encrypted weights": (_raw(flags=0x1), ("encrypted",)),
    "unknown compression method": (_raw(method=99), ("corrupt or truncated", "compression method")),
    "bad CRC": (lambda p, g, f: _raw(crc=zlib.crc32(p[1]) ^ 1)(p, g, f), ("corrupt or truncated", "CRC")),
    "channels [-4, 8]": (_kwargs(channels=[-4, 8]), ("cannot be built from its network_kwargs", "negative")),
    "channels [4, 8e9] (float)": (_kwargs(channels=[4, 8e9]), ("cannot be built from its network_kwargs",)),
    "channels [4, 8000000000]": (_kwargs(channels=[4, 8_000_000_000]), (r"channels\[1\] is 8000000000",)),
    "channels [4, 30000, 30000]: 8 billion parameters": (
        _kwargs(channels=[4, 30_000, 30_000], strides=[2, 2]), ("parameters, more than the 500,000,000",)),
    "in_channels of 100 million": (_field(in_channels=100_000_000), ("parameters, more than",)),
    "unknown network option": (_kwargs(bogus=1), ("unexpected keyword argument 'bogus'",)),
    "1000 channels": (_kwargs(channels=[4] * 1000), ("has 1000 items",)),
    "deeply nested option": (_kwargs(channels=[[[[[[4]]]]]]), ("nests deeper",)),
    "NaN option": (_kwargs(dropout=float("nan")), ("dropout is nan",)),
    "bundle.json nested 100000 deep": (_metadata_bytes(b"[" * 100_000 + b"]" * 100_000), ("not valid JSON",)),
    "bundle.json with a 5000-digit number": (
        _metadata_bytes(b'{"a": ' + b"9" * 5000 + b"}"), ("not valid JSON",)),
    "bundle.json not UTF-8": (_metadata_bytes(b'{"a": "\xff\xfe"}'), ("not valid JSON",)),
    "bundle.json is a list": (_metadata_bytes(b"[]"), ("must be a JSON object",)),
    "NaN temperature": (_field(temperature=float("nan")), ("temperature",)),
    "NaN class colour": (_field(class_colors=[[float("nan"), 0, 0]] * 4), ("class_colors",)),
    "weights_dtype float64": (_field(weights_dtype="float64"), ("weights_dtype 'float64'",)),
    "NaN in a weight": (
        _weights(lambda g, w: with_value(g, float("nan"))), ("weight model.*NaN or infinite",)),
    "inf in a float16 weight": (
        _weights(lambda g, w: with_value(g, float("inf"), torch.float16)),
        ("stored as 'F16'",)),  # the metadata says float32: the dtype check comes first
    "float64 weights": (_weights(lambda g, w: float64_weights(g)), ("stored as 'F64'",)),
    "empty weights": (_weights(lambda g, w: b""), ("not a safetensors file",)),
    "header length 2**60": (
        _weights(lambda g, w: (1 << 60).to_bytes(8, "little") + b"{}"), ("do not fit the declared network",)),
    "header not JSON": (
        _weights(lambda g, w: safetensors_with_header(b"{nope", b"")), ("header is not valid JSON",)),
    "overlapping tensors": (_weights(lambda g, w: overlapping_offsets(w)), ("lies at bytes",)),
    "data shorter than the header says": (
        _weights(lambda g, w: truncated_data(w)), ("bytes but its header describes",)),
    "checksum of other weights": (_weights(lambda g, w: with_value(g, 0.5), checksum=False), ("checksum",)),
    "feature statistics of 5000 features": (
        _field(input_statistics=_input_statistics(mean=[0.0] * 5000)),
        ("input_statistics are malformed", "features' mean must be a list of 1 to 2048 finite numbers")),
    "feature axes not orthonormal": (
        _field(input_statistics=_input_statistics(axes=[[1.0] * 8] * 7)),
        ("features' axes must be orthonormal",)),
    "NaN feature threshold": (
        _field(input_statistics=_input_statistics(threshold=float("nan"))),
        ("features' threshold must be a positive number, got nan",)),
    "features in version-2 input statistics": (
        _field(input_statistics=_input_statistics(version=2)),
        ("input_statistics are malformed", "wrong: features")),
    "input statistics of version 5": (
        _field(input_statistics=_input_statistics(version=5)), ("version 5 is not 1, 2, 3 or 4",)),
    "member features on a single network": (
        _field(input_statistics=_member_statistics()),
        ("input_statistics are malformed", "member_features hold 2 members' features for an ensemble of 1")),
    "member features combined by any member": (
        _field(input_statistics=_member_statistics(combination="any")),
        ("member_features' combination must be one of majority, got 'any'",)),
    "first-member features beside member features": (
        _field(input_statistics={**_member_statistics(), "features": _input_statistics()["features"]}),
        (r"features must be null where member_features judge the input \(version 4\)",)),
}


@pytest.mark.parametrize("case", list(BAD_BUNDLES))
def test_bad_bundle_is_one_sentence_and_changes_nothing(case, parts, good, tmp_path):
    make, patterns = BAD_BUNDLES[case]
    path = make(parts, good, tmp_path)
    before = tree_snapshot(tmp_path)
    with pytest.raises(BundleError) as caught:
        load_bundle(path)
    assert_one_sentence(str(caught.value), *patterns)
    assert tree_snapshot(tmp_path) == before


def test_nan_weights_in_float16_bundle_name_the_tensor(parts, good, tmp_path):
    weights = with_value(good, float("inf"), torch.float16)
    path = variant(parts, tmp_path / "half.calibseg", lambda m: m.update(weights_dtype="float16"),
                   weights=weights)
    with pytest.raises(BundleError) as caught:
        load_bundle(path)
    last = list(state(good))[-1]
    assert_one_sentence(str(caught.value), f"weight {last} holds NaN or infinite values")


def test_four_gib_bundle_is_refused_from_the_zip_directory(four_gib_bundle):
    assert four_gib_bundle.stat().st_size < 5_000_000
    assert zipfile.ZipFile(four_gib_bundle).getinfo(WEIGHTS_MEMBER).file_size == FOUR_GIB
    with pytest.raises(BundleError) as caught:
        load_bundle(four_gib_bundle)
    assert_one_sentence(str(caught.value), "declares 4.0 GiB", "refused unread")


def test_refusing_the_four_gib_bundle_allocates_nothing_for_it(four_gib_bundle):
    """Peak RSS of a fresh interpreter that imports CalibSeg (torch included), then refuses the bundle: the
    refusal adds under 64 MiB to the import's own peak. Measured as the difference, because the import's peak
    itself depends on the machine (how the kernel maps torch's libraries, bytecode compiled or not)."""
    script = (
        "import resource, sys\n"
        "from CalibSegLib.bundle import BundleError, load_bundle\n"
        "imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"  # KiB on Linux
        "try:\n    load_bundle(sys.argv[1])\nexcept BundleError as error:\n    print(error)\n"
        "print(imported, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(four_gib_bundle)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT),
                                 "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    message, peaks = result.stdout.strip().splitlines()
    imported_kib, refused_kib = map(int, peaks.split())
    assert "declares 4.0 GiB" in message
    assert refused_kib - imported_kib < 64 * 1024, f"the refusal added {(refused_kib - imported_kib) / 1024:.0f} MiB"
    assert refused_kib < 4 * (1 << 20)  # far below the 4 GiB the bundle declares


def test_first_pass_keeps_nothing(parts, good, tmp_path, monkeypatch):
    """A NaN bundle is refused after the streamed first pass: no tensor is built for it."""
    path = variant(parts, tmp_path / "nan.calibseg", weights=with_value(good, float("nan")))
    built = []
    monkeypatch.setattr(torch, "from_numpy", lambda *a: built.append(a) or torch.zeros(1))
    with pytest.raises(BundleError, match="NaN"):
        load_bundle(path)
    assert built == []


def test_good_bundle_still_loads_and_predicts(good):
    bundle = load_bundle(good)
    assert all(tensor.dtype == torch.float32 for tensor in bundle.state_dict.values())
    prediction = Predictor(bundle, device="cpu").predict(
        torch.rand(2, 16, 16).numpy() * 100, (1.0, 1.0, 1.0))
    assert prediction.labels.shape == (2, 16, 16)


def test_feature_statistics_of_another_network_are_one_sentence_at_prediction(good, tmp_path):
    """A layer the declared network lacks cannot be checked on load (the network is not built there):
    the first analysis says it in one sentence, and nothing is written."""
    from CalibSegLib.analysis import analyse_case

    path = _field(input_statistics=_input_statistics(layer="model.9"))(bundle_parts(good), good, tmp_path)
    before = tree_snapshot(tmp_path)
    with pytest.raises(BundleError) as caught:
        analyse_case(Predictor(path, device="cpu"), torch.rand(2, 16, 16).numpy() * 100, (1.0, 1.0, 1.0))
    assert_one_sentence(str(caught.value), "feature statistics do not fit its network",
                        "has no layer 'model.9'", "refit them with python -m Training.fit_input_check")
    assert tree_snapshot(tmp_path) == before
