"""The CalibSeg Slicer module: its logic on a real MRML scene (slicer-core), its UI file and its packaging.

The logic checks are the same functions ``CalibSegTest`` runs inside Slicer
(``CalibSeg/CalibSegTesting``).
"""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest

from mrml_standins import MODULE_DIR, install_standins, mrml_scene  # noqa: F401  (fixture)

REPO_ROOT = MODULE_DIR.parent
UI_FILE = MODULE_DIR / "Resources" / "UI" / "CalibSeg.ui"
# The volume behind Resources/SampleData (scripts/make_slicer_sample_data.py): a test patient of
# Datasets/splits/acdc.json, so the shipped models never saw it.
SAMPLE_CASE = "patient069_frame01"

install_standins()
from CalibSegTesting import CHECKS  # noqa: E402  (needs the module folder on sys.path)

pytestmark = pytest.mark.mrml


@pytest.mark.parametrize("name", list(CHECKS))
def test_logic_on_a_real_mrml_scene(name, mrml_scene, tmp_path):  # noqa: F811
    CHECKS[name](mrml_scene, tmp_path)


def test_checks_catch_a_logic_that_drops_the_geometry(mrml_scene, tmp_path, monkeypatch):  # noqa: F811
    """The geometry check fails when outputs are put on a default grid: it can fail, so its pass means something."""
    import CalibSegRunner.volumes as volumes

    monkeypatch.setattr(volumes, "add_volume_like", _without_orientation(volumes.add_volume_like))
    monkeypatch.setattr("CalibSegRunner.nodes.add_volume_like", volumes.add_volume_like)
    with pytest.raises(AssertionError):
        CHECKS["outputs_keep_input_geometry"](mrml_scene, tmp_path)


def _without_orientation(add_volume_like):
    def broken(reference_node, array, name, class_name="vtkMRMLScalarVolumeNode"):
        node = add_volume_like(reference_node, array, name, class_name)
        node.SetSpacing(1.0, 1.0, 1.0)
        return node

    return broken



def test_the_module_process_never_reads_weights_in_a_background_run(mrml_scene, tmp_path,  # noqa: F811
                                                                    monkeypatch):
    """Slicer's process reads bundle metadata only: the widget's channel list, prepare, a background run and a
    batch (through the inference child, which alone deserialises the weights) and their publishing all work
    while every weight read in this process fails; the in-process run, which reads the weights where it
    predicts, meets the trap, so the trap would catch a host that read them."""
    from CalibSegLib.bundle import archive
    from CalibSegRunner import BatchJob, InferenceJob, SegmentationRunner
    from CalibSegTesting import make_volume_node
    from tiny_bundles import make_test_bundle

    bundle = make_test_bundle(tmp_path / "tiny.calibseg", patch_size=(32, 32))
    images = [np.random.default_rng(seed).random((3, 32, 32)).astype(np.float32) for seed in range(2)]
    volumes = [make_volume_node(mrml_scene, image, f"case{index}") for index, image in enumerate(images)]
    reads = []

    def no_weights_here(*arguments, **keywords):
        reads.append(arguments)
        raise AssertionError("Slicer's process deserialised a bundle's weights")

    monkeypatch.setattr(archive, "_stream_weights", no_weights_here)
    runner = SegmentationRunner()
    two_channels = make_test_bundle(tmp_path / "two.calibseg", in_channels=2, channel_names=["T1", "T2"])
    assert _logic_channel_names(two_channels) == ["T1", "T2"]  # not its fallback for an unreadable one
    job = InferenceJob(runner, runner.prepare(volumes[0], bundle)).start()
    assert job.wait(timeout=120)
    outputs = job.finish()
    assert outputs.segmentation.GetScene() is mrml_scene and set(outputs.summary["structures"]) == {
        "class 1", "class 2", "class 3"}
    batch = BatchJob(runner, volumes, runner.settings(bundle)).start()
    assert batch.wait(timeout=240)
    assert [case.status for case in batch.finish().cases] == ["ok", "ok"]
    assert reads == []
    with pytest.raises(AssertionError, match="deserialised"):
        runner.run(volumes[0], bundle)
    assert len(reads) == 1


def _logic_channel_names(bundle: Path) -> list[str]:
    """``CalibSegLogic.channelNames`` (the widget's channel selectors) without the Qt application."""
    tree = ast.parse((MODULE_DIR / "CalibSeg.py").read_text())
    logic = next(node for node in tree.body
                 if isinstance(node, ast.ClassDef) and node.name == "CalibSegLogic")
    method = next(node for node in logic.body
                  if isinstance(node, ast.FunctionDef) and node.name == "channelNames")
    method.decorator_list = []
    namespace: dict = {}
    exec(compile(ast.Module([method], type_ignores=[]), "CalibSeg.py", "exec"), namespace)
    return namespace["channelNames"](str(bundle))


def test_offscreen_slice_view_shows_hot_spots_outlines_and_legend(mrml_scene, tmp_path):  # noqa: F811
    import matplotlib.image
    import slicer

    from tiny_bundles import make_test_bundle
    from CalibSegRunner import SegmentationRunner
    from CalibSegTesting.scene import make_volume_node, phantom
    from scripts.render_slice_view import render_slice_view

    image, _ = phantom()
    volume = make_volume_node(mrml_scene, image)
    volume.CreateDefaultDisplayNodes()
    bundle = make_test_bundle(tmp_path / "tiny.calibseg", num_classes=4, patch_size=(32, 32))
    outputs = SegmentationRunner().run(volume, bundle)
    names = ["background", "class 1", "class 2", "class 3"]
    colors = [(0, 0, 0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)]

    def render(level: float, name: str) -> np.ndarray:
        SegmentationRunner.setHotSpotLevel(outputs, level)
        path, blended = render_slice_view(mrml_scene, volume, outputs, names, colors, tmp_path / name, size=300,
                                          slice_index=3)
        picture = matplotlib.image.imread(path)
        assert picture.shape[0] >= 400 and picture.shape[1] >= 500 and picture[..., :3].std() > 0.05
        assert blended.shape == (300, 300, 3)
        return blended.astype(int)

    # The untrained network is unsure everywhere: at the slice's quartiles of entropy, 3/4, 1/2 and 1/4 of it
    # are hot spots.
    low, median, high = np.quantile(slicer.util.arrayFromVolume(outputs.uncertainty)[3], [0.25, 0.5, 0.75])
    blended, everything, nothing = render(median, "view.png"), render(0.0, "all.png"), render(1.0, "none.png")
    more, fewer = render(low, "more.png"), render(high, "fewer.png")
    predicted = slicer.util.arrayFromVolume(mrml_scene.GetFirstNodeByName("CalibSeg snapshot labels"))[3]
    outline = np.zeros(blended.shape[:2], bool)
    for label, color in enumerate(colors[1:], start=1):
        pixels = np.all(np.abs(blended - np.array(color) * 255) <= 3, axis=-1)
        assert pixels.any() == bool((predicted == label).any()), label
        outline |= pixels

    def coloured(view: np.ndarray) -> np.ndarray:  # off the outlines, not grey
        return ~outline & (np.ptp(view, axis=-1) > 5)

    assert not coloured(nothing).any()  # at the top level (1: no entropy reaches it) only grey anatomy shows
    # Off the outlines fewer hot pixels remain than voxels (entropy peaks where the labels change, under
    # the outlines), but the share follows the level.
    shares = [coloured(view).sum() / coloured(everything).sum() for view in (more, blended, fewer)]
    assert 1.0 > shares[0] > shares[1] > shares[2] > 0.0 and 0.15 < shares[1] < 0.85, shares
    # The input is drawn under the hot spots' gaps: a darker window/level darkens the view (a scene whose
    # colour logic has gone draws the background black, and then the window would change nothing).
    display = volume.GetDisplayNode()
    display.AutoWindowLevelOff()
    display.SetWindowLevel(display.GetWindow(), display.GetLevel() + display.GetWindow())
    darker = render(median, "darker.png")
    assert blended.mean() - darker.mean() > 10


def _ui_widgets() -> dict[str, str]:
    root = ElementTree.parse(UI_FILE).getroot()
    return {widget.get("name"): widget.get("class") for widget in root.iter("widget")}


def test_ui_file_parses_and_has_every_widget_the_module_uses():
    widgets = _ui_widgets()
    source = (MODULE_DIR / "CalibSeg.py").read_text()
    used = set(re.findall(r"self\.ui\.(\w+)", source))
    assert used and used <= widgets.keys(), f"missing in CalibSeg.ui: {sorted(used - widgets.keys())}"


def test_ui_binds_every_parameter_to_a_widget():
    """Each field of the parameter node is edited by exactly one widget (SlicerParameterName)."""
    root = ElementTree.parse(UI_FILE).getroot()
    bound = [prop.find("string").text for prop in root.iter("property") if prop.get("name") == "SlicerParameterName"]
    tree = ast.parse((MODULE_DIR / "CalibSeg.py").read_text())
    parameters = next(node for node in tree.body
                      if isinstance(node, ast.ClassDef) and node.name == "CalibSegParameterNode")
    fields = [statement.target.id for statement in parameters.body if isinstance(statement, ast.AnnAssign)]
    assert sorted(bound) == sorted(fields)



def test_slider_defaults_are_the_library_levels_written_once():
    """The parameter node starts its sliders at CalibSegLib's levels by name, and the .ui repeats no value a
    parameter sets (connectGui fills the widgets), so no number is written twice."""
    tree = ast.parse((MODULE_DIR / "CalibSeg.py").read_text())
    parameters = next(node for node in tree.body
                      if isinstance(node, ast.ClassDef) and node.name == "CalibSegParameterNode")
    defaults = {statement.target.id: statement.value for statement in parameters.body
                if isinstance(statement, ast.AnnAssign) and statement.value is not None}
    assert not [name for name, value in defaults.items()
                if isinstance(value, ast.Constant) and isinstance(value.value, float)]
    assert ast.unparse(defaults["lowConfidenceThreshold"]) == "LOW_CONFIDENCE_THRESHOLD"
    assert ast.unparse(defaults["hotSpotLevel"]) == "HOT_SPOT_LEVEL"
    root = ElementTree.parse(UI_FILE).getroot()
    bound = [widget for widget in root.iter("widget")
             if "SlicerParameterName" in {item.get("name") for item in widget.findall("property")}]
    repeated = [widget.get("name") for widget in bound
                if "value" in {item.get("name") for item in widget.findall("property")}]
    assert repeated == []


def _cmake_globbed(cmake_file: Path, variable: str) -> set[str]:
    """The files ``file(GLOB[_RECURSE] <variable> RELATIVE ${REPOSITORY_DIR} ...)`` collects, globbed here as CMake
    does."""
    block = re.search(rf"file\((GLOB_RECURSE|GLOB) {variable} RELATIVE \$\{{REPOSITORY_DIR\}} CONFIGURE_DEPENDS"
                      r"\n(.*?)\n\s*\)", cmake_file.read_text(), re.S)
    assert block, f"{cmake_file} has no file(GLOB... {variable} ...)"
    found = set()
    for line in block.group(2).splitlines():
        folder, pattern = line.strip().removeprefix("${REPOSITORY_DIR}/").rsplit("/", 1)
        glob = (REPO_ROOT / folder).rglob if block.group(1) == "GLOB_RECURSE" else (REPO_ROOT / folder).glob
        paths = glob(pattern)
        found |= {str(path.relative_to(REPO_ROOT)) for path in paths}
    return found


def test_cmake_ships_the_whole_library_its_models_and_no_test_code():
    cmake = MODULE_DIR / "CMakeLists.txt"
    library = {str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "CalibSegLib").rglob("*.py")}
    assert _cmake_globbed(cmake, "CALIBSEGLIB_PYTHON_SCRIPTS") == library
    shipped = {str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "CalibSegLib" / "pretrained").iterdir()
               if path.is_file() and path.suffix != ".py"}
    assert _cmake_globbed(cmake, "CALIBSEGLIB_DATA_FILES") == shipped
    # the same data files as the Python package's
    package_data = re.search(r"^CalibSegLib = \[(.*)\]$", (REPO_ROOT / "pyproject.toml").read_text(), re.M)
    assert {str(path.relative_to(REPO_ROOT)) for pattern in re.findall(r'"([^"]+)"', package_data.group(1))
            for path in (REPO_ROOT / "CalibSegLib").glob(pattern)} == shipped
    # nothing in the library (or the module) is there for the tests alone
    for path in [*(REPO_ROOT / path for path in library), *MODULE_DIR.rglob("*.py")]:
        assert not re.search(r"^\s*(import pytest|from tiny_bundles)", path.read_text(), re.M), path


def test_extension_metadata_is_complete():
    text = (REPO_ROOT / "CMakeLists.txt").read_text()
    for key in ("EXTENSION_HOMEPAGE", "EXTENSION_CATEGORY", "EXTENSION_CONTRIBUTORS", "EXTENSION_DESCRIPTION",
                "EXTENSION_ICONURL", "EXTENSION_SCREENSHOTURLS", "EXTENSION_DEPENDS"):
        assert re.search(rf"set\({key} \S", text), key
    assert 'set(EXTENSION_CATEGORY "Segmentation")' in text
    assert "add_subdirectory(CalibSeg)" in text


def test_shipped_sample_and_default_model_run_in_the_module(mrml_scene, sample_acdc_dir):  # noqa: F811
    """The module's sample data (volume + .seg.nrrd reference) and the preselected shipped model give
    the metrics CalibSegLib computes from the original ACDC file."""
    import h5py
    import slicer

    from CalibSegLib.inference import Predictor
    from CalibSegLib.metrics import dice, ece
    from CalibSegLib.pretrained import DEFAULT_MODEL, resolve_bundle_path
    from CalibSegRunner import SegmentationRunner

    sample_dir = MODULE_DIR / "Resources" / "SampleData"
    volume = mrml_scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "ACDC patient")
    volume_storage = slicer.vtkMRMLVolumeArchetypeStorageNode()
    volume_storage.SetFileName(str(sample_dir / "acdc_patient_image.nii.gz"))
    assert volume_storage.ReadData(volume)
    reference = mrml_scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "ACDC patient reference")
    reference_storage = slicer.vtkMRMLSegmentationStorageNode()
    reference_storage.SetFileName(str(sample_dir / "acdc_patient_reference.seg.nrrd"))
    assert reference_storage.ReadData(reference)

    bundle = resolve_bundle_path(DEFAULT_MODEL)
    outputs = SegmentationRunner().run(volume, bundle, referenceNode=reference, device="cpu")

    with h5py.File(sample_acdc_dir / f"{SAMPLE_CASE}.h5", "r") as handle:
        image, labels = handle["image"][...], handle["label"][...].astype(np.int64)
    np.testing.assert_allclose(volume.GetSpacing(), (1.5, 1.5, 10.0))
    prediction = Predictor(bundle, device="cpu").predict(image, (10.0, 1.5, 1.5), keep_probabilities=True)
    expected_dice = dice(prediction.labels, labels, 4)
    np.testing.assert_allclose(outputs.metrics["Dice mean"], expected_dice.mean(), rtol=1e-6)
    np.testing.assert_allclose(outputs.metrics["ECE"], ece(prediction.probabilities, labels), rtol=1e-6)
