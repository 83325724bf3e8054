"""Model bundles: round trip, fp16 storage, atomic writes, a BundleError for each way a bundle is wrong."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save as save_safetensors

from CalibSegLib.bundle import SCHEMA_VERSION, Bundle, BundleError, load_bundle, read_metadata, save_bundle
from CalibSegLib.bundle.ensemble import Ensemble, SelectedFrom
from CalibSegLib.bundle.schema import SINGLE_NETWORK_SCHEMA_VERSION
from CalibSegLib.inference import Predictor
from CalibSegLib.networks import build_network
from CalibSegLib.pretrained import pretrained_models
from CalibSegLib.sliding_window import MAX_VOXELS_PER_PASS, SlidingWindow, windows_per_pass
from tiny_bundles import TINY_UNET, ensemble_section, make_test_bundle, make_test_ensemble, make_test_metadata


class _RunsCodeWhenUnpickled:
    """Unpickling this executes code: exactly what a bundle must never do."""

    def __reduce__(self):
        return exec, ("raise SystemExit('a pickle in a bundle was executed')",)


def rewritten(good: Path, out: Path, change=None, weights: bytes | None = None, extra=None) -> Path:
    """A copy of ``good`` at ``out`` with ``bundle.json`` edited by ``change``, new weights, added members."""
    with zipfile.ZipFile(good) as archive:
        metadata = json.loads(archive.read("bundle.json"))
        original_weights = archive.read("weights.safetensors")
    if change is not None:
        change(metadata)
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("bundle.json", json.dumps(metadata))
        archive.writestr("weights.safetensors", original_weights if weights is None else weights)
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return out


def with_weights(good: Path, out: Path, weights: bytes) -> Path:
    """``good`` with other weight bytes and a checksum that matches them (so only the content is wrong)."""
    checksum = hashlib.sha256(weights).hexdigest()
    return rewritten(good, out, lambda m: m.update(weights_sha256=checksum), weights=weights)


@pytest.fixture()
def good(tmp_path) -> Path:
    return make_test_bundle(tmp_path / "good.calibseg")


def test_round_trip_gives_identical_weights_metadata_and_predictions(tmp_path):
    torch.manual_seed(3)
    model = build_network("unet", 1, 4, **TINY_UNET).eval()
    metadata = make_test_metadata(temperature=[1.0, 1.5, 2.0, 0.5])
    path = save_bundle(tmp_path / "model.calibseg", model, metadata)
    bundle = load_bundle(path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(bundle.state_dict[name], tensor)
    assert bundle.metadata.preprocessing == metadata.preprocessing
    assert bundle.metadata.class_colors == metadata.class_colors
    assert bundle.metadata.training == metadata.training
    assert bundle.metadata.temperature == [1.0, 1.5, 2.0, 0.5]
    assert bundle.metadata.schema_version == SINGLE_NETWORK_SCHEMA_VERSION
    assert bundle.metadata.weights_dtype == "float32"
    image = np.random.default_rng(0).normal(size=(3, 40, 36)).astype(np.float32)
    in_memory = Predictor(Bundle(metadata, model.state_dict()), device="cpu").predict(
        image, (5, 1, 1), keep_probabilities=True
    )
    from_file = Predictor(path, device="cpu").predict(image, (5, 1, 1), keep_probabilities=True)
    np.testing.assert_array_equal(in_memory.probabilities, from_file.probabilities)


def test_bundle_json_records_every_section(good):
    with zipfile.ZipFile(good) as archive:
        assert sorted(archive.namelist()) == ["bundle.json", "weights.safetensors"]
        stored = json.loads(archive.read("bundle.json"))
        assert stored["weights_sha256"] == hashlib.sha256(archive.read("weights.safetensors")).hexdigest()
    assert {
        "schema_version",
        "network",
        "network_kwargs",
        "in_channels",
        "num_classes",
        "spatial_dims",
        "class_names",
        "class_colors",
        "preprocessing",
        "sliding_window",
        "postprocessing",
        "training",
        "temperature",
        "data",
        "validation_metrics",
        "test_metrics",
        "quality_model",
        "class_terminology",
        "input_statistics",
        "channel_names",
        "library_version",
        "weights_dtype",
        "weights_sha256",
        "ensemble_size",
        "ensemble",
        "function_intervals",
    } == set(stored)
    assert stored["preprocessing"] == {
        "normalization": "percentile",
        "upper_percentile": 99.0,
        "target_spacing": [1.5, 1.5],
        "slice_axis": 0,
        "channel_normalization": None,
    }
    assert stored["sliding_window"] == {"patch_size": [64, 64], "overlap": 0.5, "mirror_axes": [], "batch_size": 32}
    assert stored["postprocessing"] == {"largest_component": []}
    assert stored["training"]["loss_state"]["multipliers"]["inner"] == [1e-6] * 4


def test_tensor_hyperparameters_are_stored_as_plain_json(tmp_path):
    multipliers = torch.full((2, 4), 0.25)
    training = {"method": "crac", "crac_multipliers": multipliers, "margin": np.float32(5.0)}
    path = make_test_bundle(tmp_path / "m.calibseg", training=training)
    assert load_bundle(path).metadata.training == {
        "method": "crac",
        "crac_multipliers": [[0.25] * 4] * 2,
        "margin": 5.0,
    }


def test_half_precision_is_smaller_and_loads_as_float32(tmp_path):
    full = make_test_bundle(tmp_path / "full.calibseg", seed=1)
    half = make_test_bundle(tmp_path / "half.calibseg", seed=1, half=True)
    assert half.stat().st_size < full.stat().st_size
    full_bundle, half_bundle = load_bundle(full), load_bundle(half)
    assert half_bundle.metadata.weights_dtype == "float16"
    for name, tensor in half_bundle.state_dict.items():
        assert tensor.dtype == full_bundle.state_dict[name].dtype
        torch.testing.assert_close(tensor, full_bundle.state_dict[name], atol=2e-3, rtol=1e-3)


def test_same_seed_gives_byte_identical_weights(tmp_path):
    first = load_bundle(make_test_bundle(tmp_path / "a.calibseg", seed=7)).metadata.weights_sha256
    second = load_bundle(make_test_bundle(tmp_path / "b.calibseg", seed=7)).metadata.weights_sha256
    assert first == second


def test_the_same_content_saved_again_is_the_same_file(tmp_path, monkeypatch):
    """A rewrite that changes nothing keeps the file's bytes (no save time in the zip), so records keyed on the file's
    SHA-256 still belong to it."""
    first = make_test_bundle(tmp_path / "a.calibseg", seed=7)
    bundle = load_bundle(first)
    later = time.time() + 86400.0
    monkeypatch.setattr(time, "time", lambda: later)  # saved a day later
    second = save_bundle(tmp_path / "b.calibseg", bundle.state_dict, bundle.metadata)
    assert second.read_bytes() == first.read_bytes()


def test_failed_save_keeps_the_previous_file_and_leaves_no_temporary(good):
    before = good.read_bytes()
    three_classes = build_network("unet", 1, 3, **TINY_UNET)  # the metadata says 4
    with pytest.raises(BundleError, match="do not fit"):
        save_bundle(good, three_classes, make_test_metadata())
    assert good.read_bytes() == before
    assert [path.name for path in good.parent.iterdir()] == [good.name]


def _not_a_zip(good: Path, folder: Path) -> Path:
    (folder / "text.calibseg").write_text("this is not a bundle")
    return folder / "text.calibseg"


def _without_metadata(good: Path, folder: Path) -> Path:
    with zipfile.ZipFile(folder / "nometa.calibseg", "w") as archive:
        archive.writestr("weights.safetensors", b"")
    return folder / "nometa.calibseg"


def _truncated(good: Path, folder: Path) -> Path:
    data = good.read_bytes()
    (folder / "cut.calibseg").write_bytes(data[: len(data) // 2] + data[-200:])
    return folder / "cut.calibseg"


def _invalid_json(good: Path, folder: Path) -> Path:
    with zipfile.ZipFile(folder / "json.calibseg", "w") as archive:
        archive.writestr("bundle.json", "{not json")
        archive.writestr("weights.safetensors", b"")
    return folder / "json.calibseg"


def _torch_saved_weights(good: Path, folder: Path) -> Path:
    buffer = io.BytesIO()
    torch.save(load_bundle(good).state_dict, buffer)  # a pickle archive, not safetensors
    return with_weights(good, folder / "pt.calibseg", buffer.getvalue())


def _pickled_code_weights(good: Path, folder: Path) -> Path:
    return with_weights(good, folder / "code.calibseg", pickle.dumps(_RunsCodeWhenUnpickled(), protocol=4))


def _wrong_shape_weights(good: Path, folder: Path) -> Path:
    state = {name: tensor.clone() for name, tensor in load_bundle(good).state_dict.items()}
    name = next(iter(state))
    state[name] = torch.zeros(state[name].shape[0] + 1, *state[name].shape[1:])
    return with_weights(good, folder / "shape.calibseg", save_safetensors(state))


def _missing_weight(good: Path, folder: Path) -> Path:
    state = dict(load_bundle(good).state_dict)
    state.pop(next(iter(state)))
    return with_weights(good, folder / "missing.calibseg", save_safetensors(state))


BAD_BUNDLES = {
    "missing file": (lambda good, folder: folder / "absent.calibseg", "No model bundle at"),
    "not a zip": (_not_a_zip, "not a zip file"),
    "no bundle.json": (_without_metadata, "has no bundle.json"),
    "invalid json": (_invalid_json, "not valid JSON"),
    "missing field": (
        lambda g, f: rewritten(g, f / "req.calibseg", lambda m: m.pop("class_names")),
        "lacks the required field.*class_names",
    ),
    "no checksum": (
        lambda g, f: rewritten(g, f / "sha.calibseg", lambda m: m.pop("weights_sha256")),
        "lacks the required field weights_sha256",
    ),
    "wrong type": (
        lambda g, f: rewritten(g, f / "type.calibseg", lambda m: m.update(num_classes="4")),
        "num_classes must be an integer",
    ),
    "newer schema": (
        lambda g, f: rewritten(g, f / "new.calibseg", lambda m: m.update(schema_version=SCHEMA_VERSION + 1)),
        "newer than this CalibSeg",
    ),
    "checksum mismatch": (
        lambda g, f: rewritten(g, f / "sum.calibseg", lambda m: m.update(weights_sha256="0" * 64)),
        "do not match their checksum",
    ),
    "unknown network": (
        lambda g, f: rewritten(g, f / "net.calibseg", lambda m: m.update(network="vnet9000")),
        "unknown network 'vnet9000'",
    ),
    "weights for another network": (
        lambda g, f: rewritten(g, f / "fit.calibseg", lambda m: m["network_kwargs"].update(channels=[8, 16])),
        "do not fit the declared network",
    ),
    "wrong weight shape": (_wrong_shape_weights, "wrong shape"),
    "missing weight": (_missing_weight, "missing"),
    "class count mismatch": (
        lambda g, f: rewritten(g, f / "cls.calibseg", lambda m: m.update(class_names=["a"])),
        "not one name and one colour",
    ),
    "bad temperature": (
        lambda g, f: rewritten(g, f / "t.calibseg", lambda m: m.update(temperature=[1.0, 2.0])),
        "temperature",
    ),
    "old resize-based schema": (
        lambda g, f: rewritten(g, f / "v1.calibseg", lambda m: m.update(schema_version=1)),
        "schema version 1, from a CalibSeg that resized slices",
    ),
    "unknown preprocessing field": (
        lambda g, f: rewritten(g, f / "ts.calibseg", lambda m: m["preprocessing"].update(target_size=[224, 224])),
        "unknown field.*target_size",
    ),
    "zero target spacing": (
        lambda g, f: rewritten(g, f / "sp0.calibseg", lambda m: m["preprocessing"].update(target_spacing=[0, 1.5])),
        r"target_spacing must be two \(y, x\) or three \(z, y, x\) positive, finite spacings",
    ),
    "infinite target spacing": (
        lambda g, f: rewritten(g, f / "spi.calibseg",
                               lambda m: m["preprocessing"].update(target_spacing=[float("inf"), 1.5])),
        r"target_spacing must be two \(y, x\) or three \(z, y, x\) positive, finite spacings",
    ),
    "huge window": (
        lambda g, f: rewritten(g, f / "win.calibseg", lambda m: m["sliding_window"].update(patch_size=[40000, 40000])),
        r"patch_size must be two integers \(y, x\) in 8..2048",
    ),
    "2D bundle with a (z, y, x) spacing": (
        lambda g, f: rewritten(g, f / "d2s3.calibseg",
                               lambda m: m["preprocessing"].update(target_spacing=[3.0, 1.5, 1.5])),
        r"target_spacing has 3 values but its network is 2D; a 2D bundle needs \(y, x\)",
    ),
    "3D bundle with an in-plane window": (
        lambda g, f: rewritten(g, f / "d3w2.calibseg", lambda m: (
            m.update(spatial_dims=3), m["preprocessing"].update(target_spacing=[3.0, 1.5, 1.5]))),
        r"patch_size has 2 values but its network is 3D; a 3D bundle needs \(z, y, x\)",
    ),
    "window batch too large": (
        lambda g, f: rewritten(g, f / "wb.calibseg",
                               lambda m: m["sliding_window"].update(patch_size=[1024, 1024], batch_size=64)),
        "per pass exceed",
    ),
    "bad mirror axis": (
        lambda g, f: rewritten(g, f / "mir.calibseg", lambda m: m["sliding_window"].update(mirror_axes=[2])),
        "mirror_axes",
    ),
    "post-processing of a class the model lacks": (
        lambda g, f: rewritten(g, f / "pp.calibseg", lambda m: m["postprocessing"].update(largest_component=[7])),
        "postprocessing names class 7",
    ),
    "pickle member": (
        lambda g, f: rewritten(g, f / "pkl.calibseg", extra={"model.pkl": pickle.dumps({"a": 1})}),
        "pickled objects are refused",
    ),
    ".pt member": (
        lambda g, f: rewritten(g, f / "pt.calibseg", extra={"weights.pt": b"PK\x03\x04"}),
        "contains weights.pt",
    ),
    "torch.save weights": (_torch_saved_weights, "pickle .*refused"),
    "pickled code as weights": (_pickled_code_weights, "pickle .*refused"),
    "truncated": (_truncated, "corrupt or truncated"),
}


@pytest.mark.parametrize("case", list(BAD_BUNDLES))
def test_bad_bundle_is_refused_with_one_sentence(good, tmp_path, case):
    make, message = BAD_BUNDLES[case]
    with pytest.raises(BundleError, match=message) as caught:
        load_bundle(make(good, tmp_path))
    text = str(caught.value)
    assert "\n" not in text and text.endswith(".")


# Every refusal that does not need the weights' bytes, as read_metadata checks them too.
_WEIGHTS_CASES = ("checksum mismatch", "weights for another network", "wrong weight shape", "missing weight",
                  "torch.save weights", "pickled code as weights", "truncated")


@pytest.mark.parametrize("case", [case for case in BAD_BUNDLES if case not in _WEIGHTS_CASES])
def test_reading_the_metadata_alone_refuses_what_load_refuses_outside_the_weights(good, tmp_path, case):
    make, message = BAD_BUNDLES[case]
    with pytest.raises(BundleError, match=message):
        read_metadata(make(good, tmp_path))


def test_reading_the_metadata_alone_never_touches_the_weights(good, tmp_path):
    broken = with_weights(good, tmp_path / "broken.calibseg", b"not safetensors at all")
    with pytest.raises(BundleError):
        load_bundle(broken)
    assert read_metadata(broken).class_names == load_bundle(good).metadata.class_names
    assert read_metadata(good) == load_bundle(good).metadata


@pytest.mark.parametrize("patch_size, expected", [((128, 128), 32), ((512, 512), 8), ((1024, 1024), 2),
                                                  ((1200, 1600), 1)])
def test_windows_per_pass_keeps_a_trainers_window_within_the_bound(patch_size, expected):
    windows = windows_per_pass(patch_size)
    assert windows == expected
    assert windows == 1 or windows * patch_size[0] * patch_size[1] <= MAX_VOXELS_PER_PASS
    SlidingWindow(patch_size=patch_size, batch_size=windows).validate()


def test_save_refuses_invalid_metadata_before_writing(tmp_path):
    model = build_network("unet", 1, 4, **TINY_UNET)
    with pytest.raises(BundleError, match="class_colors"):
        save_bundle(tmp_path / "x.calibseg", model, make_test_metadata(class_colors=[(2.0, 0.0, 0.0)] * 4))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", sorted(pretrained_models()))
def test_a_shipped_bundle_passes_the_ensemble_checks_and_rewrites_its_bundle_json_unchanged(name):
    path = pretrained_models()[name]
    metadata = read_metadata(path)
    assert metadata.to_json().encode() == zipfile.ZipFile(path).read("bundle.json")
    assert Ensemble.from_dict(metadata.ensemble.to_dict(), metadata.ensemble_size) == metadata.ensemble


def test_a_sub_ensembles_origin_is_read_through_its_checked_form(tmp_path):
    five = load_bundle(make_test_ensemble(tmp_path / "five.calibseg", 5)).metadata
    origin = SelectedFrom("five.calibseg", five.weights_sha256, (4, 0))
    two = read_metadata(make_test_ensemble(tmp_path / "two.calibseg", 2, selected_from=origin))
    assert (two.selected_from, two.out_of_fold_weights_sha256) == (origin, five.weights_sha256)
    assert (five.selected_from, five.out_of_fold_weights_sha256) == (None, five.weights_sha256)
    assert ([two.out_of_fold_member(member) for member in range(2)], five.out_of_fold_member(3)) == ([4, 0], 3)
    assert Ensemble.from_dict(two.ensemble.to_dict(), 2) == two.ensemble
    # metadata built in memory is held to what a reader accepts: its section's stored form, read back
    repeated = SelectedFrom("five.calibseg", five.weights_sha256, (4, 4))
    with pytest.raises(BundleError, match=r"^The bundle's ensemble is malformed \(selected_from's members must be"):
        make_test_metadata(ensemble_size=2, ensemble=ensemble_section(2, repeated)).validate()
    with pytest.raises(BundleError, match=r"^The bundle's ensemble must be an Ensemble object\.$"):
        make_test_metadata(ensemble_size=2, ensemble=ensemble_section(2).to_dict()).validate()


def test_an_ensembles_members_know_their_training_patients_and_a_sub_ensemble_keeps_their_entries():
    ensemble = ensemble_section(3, validation=[["a"], ["b", "c"], ["d"]])
    assert [member.training_patients(["a", "b", "c", "d"]) for member in ensemble.members] == [
        ["b", "c", "d"], ["a", "d"], ["a", "b", "c"]]
    kept = ensemble.kept([2, 0], "three.calibseg", "f" * 64)
    assert (kept.members, kept.temperature) == ((ensemble.members[2], ensemble.members[0]), ensemble.temperature)
    assert kept.selected_from == SelectedFrom("three.calibseg", "f" * 64, (2, 0))
