"""Model bundles: round trip, and one clear BundleError for every way a bundle can be wrong."""

from __future__ import annotations

import io
import json
import pickle
import zipfile

import numpy as np
import pytest
import torch

from CalibSegLib.bundle import SCHEMA_VERSION, BundleError, load_bundle, save_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.networks import build_network
from bundle_factory import TINY_UNET, make_metadata, make_test_bundle


def rewrite(path, out, change_metadata=None, weights=None, extra=None):
    with zipfile.ZipFile(path) as archive:
        metadata = json.loads(archive.read("bundle.json"))
        original_weights = archive.read("weights.safetensors")
    if change_metadata:
        change_metadata(metadata)
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("bundle.json", json.dumps(metadata))
        archive.writestr("weights.safetensors", original_weights if weights is None else weights)
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return out


def test_round_trip_gives_identical_predictions(tmp_path):
    path = make_test_bundle(tmp_path / "a.calibseg")
    bundle = load_bundle(path)
    torch.manual_seed(0)
    reference = build_network("unet", 1, 4, **TINY_UNET).eval()
    image = np.random.default_rng(0).random((3, 40, 36)).astype(np.float32)
    first = Predictor(bundle, device="cpu").predict(image, (5, 1, 1), keep_probabilities=True)
    second = Predictor(path, device="cpu").predict(image, (5, 1, 1), keep_probabilities=True)
    np.testing.assert_array_equal(first.probabilities, second.probabilities)
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(bundle.state_dict[name], tensor)
    assert bundle.metadata.training["crac_multipliers"]["inner"] == [0.2] * 4
    assert bundle.metadata.schema_version == SCHEMA_VERSION and len(bundle.metadata.weights_sha256) == 64


def test_half_precision_bundle_is_smaller_and_close(tmp_path):
    torch.manual_seed(0)
    model = build_network("unet", 1, 4, **TINY_UNET)
    full = save_bundle(tmp_path / "full.calibseg", model, make_metadata())
    half = save_bundle(tmp_path / "half.calibseg", model, make_metadata(), half=True)
    assert half.stat().st_size < full.stat().st_size
    for name, tensor in load_bundle(half).state_dict.items():
        torch.testing.assert_close(tensor, model.state_dict()[name].float(), atol=1e-3, rtol=1e-3)


def test_save_is_atomic_and_keeps_previous_file_on_error(tmp_path):
    path = make_test_bundle(tmp_path / "model.calibseg")
    before = path.read_bytes()
    wrong = build_network("unet", 1, 3, **TINY_UNET)  # 3 classes, metadata says 4
    with pytest.raises(BundleError, match="do not fit"):
        save_bundle(path, wrong, make_metadata())
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.calibseg"]


@pytest.mark.parametrize("make,message", [
    (lambda p, t: t / "missing.calibseg", "No model bundle"),
    (lambda p, t: (t / "x.calibseg").write_text("not a zip") and t / "x.calibseg", "not a zip"),
    (lambda p, t: _zip_without_metadata(t), "has no bundle.json"),
    (lambda p, t: rewrite(p, t / "new.calibseg", lambda m: m.update(schema_version=SCHEMA_VERSION + 1)), "newer"),
    (lambda p, t: rewrite(p, t / "sum.calibseg", lambda m: m.update(weights_sha256="0" * 64)), "checksum"),
    (lambda p, t: rewrite(p, t / "net.calibseg", lambda m: m.update(network="vnet9000")), "unknown network"),
    (lambda p, t: rewrite(p, t / "fit.calibseg", lambda m: m.update(network_kwargs={"channels": [8, 16], "strides": [2]})),
     "do not fit"),
    (lambda p, t: rewrite(p, t / "req.calibseg", lambda m: m.pop("class_names")), "required field"),
    (lambda p, t: rewrite(p, t / "pkl.calibseg", extra={"model.pkl": pickle.dumps({"a": 1})}), "pickled objects are refused"),
    (lambda p, t: rewrite(p, t / "cls.calibseg", lambda m: m.update(class_names=["a"])), "classes"),
    (lambda p, t: _truncated(p, t), "corrupt"),
])
def test_bad_bundles_are_refused_with_one_sentence(tmp_path, make, message):
    good = make_test_bundle(tmp_path / "good.calibseg")
    bad = make(good, tmp_path)
    with pytest.raises(BundleError, match=message) as caught:
        load_bundle(bad)
    assert "\n" not in str(caught.value)


def test_pickled_weights_are_refused(tmp_path):
    good = make_test_bundle(tmp_path / "good.calibseg")
    buffer = io.BytesIO()
    torch.save({"weight": torch.zeros(1)}, buffer)  # a pickle, not safetensors
    bad = rewrite(good, tmp_path / "p.calibseg", lambda m: m.update(weights_sha256=__import__("hashlib").sha256(buffer.getvalue()).hexdigest()),
                  weights=buffer.getvalue())
    with pytest.raises(BundleError, match="safetensors"):
        load_bundle(bad)


def _zip_without_metadata(folder):
    path = folder / "nometa.calibseg"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("weights.safetensors", b"")
    return path


def _truncated(good, folder):
    path = folder / "cut.calibseg"
    data = good.read_bytes()
    path.write_bytes(data[: len(data) // 2] + data[-200:])
    return path
