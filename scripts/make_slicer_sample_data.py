"""Write the CalibSeg module's sample data and the README's picture (rerun after changing the models).

    .venv/bin/python -m scripts.make_slicer_sample_data [--model acdc_crac] [--picture-only]
        [--picture-case hardest|patientNNN_frameMM] [--data SampleData/ACDC]

(from the repository root: it uses the test suite's stand-ins for the Slicer application,
``Testing/mrml_standins.py``).

Writes into ``CalibSeg/Resources/SampleData/``: the end-diastolic frame of patient069, a test
patient of both ``Datasets/splits/acdc.json`` (so the shipped models never saw it) and, as a
validation patient, of ``acdc_sample.json``, as NIfTI with ACDC's assumed spacing
(``acdc_patient_image.nii.gz``), its reference labelmap on exactly that grid for the command line's
``--reference`` (``acdc_patient_labels.nii.gz``: 0 background, 1 right ventricle, 2 myocardium,
3 left ventricle) and the same reference as a Slicer segmentation (``.seg.nrrd``, segments named and
coloured as the model's classes, cropped to its extent as Slicer saves them);
``--picture-only`` leaves them as they are.

The picture (``docs/images/slice_view.png``) shows what a reader should look at first: a *hard*
test case — by default the volume of a test patient of ``acdc.json`` in ``--data`` on which
``--model`` (a shipped model's name or a bundle path; default
:data:`CalibSegLib.pretrained.DEFAULT_MODEL`) has the lowest mean Dice — at its most uncertain
slice, with the uncertainty hot spots over the anatomy, the predicted outlines and the quality
summary's review flags in the title. It is rendered by the module's own logic and Slicer's slice
pipeline in a slicer-core MRML scene. Needs the slicer-core package (installed by ``.[dev]``).
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
from pathlib import Path

from CalibSegLib.bundle import load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.io import ImageGeometry, atomic_output, write_image
from CalibSegLib.metrics import dice
from CalibSegLib.pretrained import DEFAULT_MODEL, resolve_bundle_path
from Datasets.layouts import find_cases
from Datasets.loading import Case, load_cases
from Datasets.splits import SPLITS_DIR, load_split, select_patients

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO_ROOT / "CalibSeg" / "Resources" / "SampleData"
PICTURE = REPO_ROOT / "docs" / "images" / "slice_view.png"
PICTURE_ZOOM = 2.0  # field of view: twice the predicted heart's extent, so thin hot spots stay visible
CASE = "patient069_frame01"


def write_reference_segmentation(labels, geometry: ImageGeometry, class_names, class_colors, path: Path) -> None:
    """A .seg.nrrd with one named, coloured segment per foreground class, made with Slicer's own MRML classes."""
    from Testing.mrml_standins import install_standins

    slicer = install_standins()
    scene = slicer.vtkMRMLScene()
    with tempfile.TemporaryDirectory() as folder:
        label_file = Path(folder) / "labels.nii.gz"
        write_image(label_file, labels.astype("uint8"), geometry)
        storage = slicer.vtkMRMLVolumeArchetypeStorageNode()
        labelmap = scene.AddNewNodeByClass("vtkMRMLLabelMapVolumeNode", "reference")
        storage.SetFileName(str(label_file))
        storage.ReadData(labelmap)
    segmentation = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "reference")
    slicer.vtkSlicerSegmentationsModuleLogic.ImportLabelmapToSegmentationNode(labelmap, segmentation)
    for index in range(segmentation.GetSegmentation().GetNumberOfSegments()):
        segment = segmentation.GetSegmentation().GetNthSegment(index)
        label = int(segment.GetLabelValue())
        segment.SetName(class_names[label])
        segment.SetColor(*class_colors[label])
    with atomic_output(path) as temporary:
        writer = slicer.vtkMRMLSegmentationStorageNode()
        writer.SetFileName(str(temporary))  # the temporary name keeps the .seg.nrrd extension
        if not writer.WriteData(segmentation):
            raise RuntimeError(f"Slicer could not write {path}.")


def write_sample_volumes() -> tuple[Case, ImageGeometry]:
    """The module's sample volume (patient069, end-diastole) and its reference labelmap on the same
    grid, as NIfTI; returns the case and that grid."""
    files = [case for case in select_patients(find_cases(REPO_ROOT / "SampleData" / "ACDC"), [CASE.split("_")[0]])
             if case.case_id == CASE]
    case = load_cases(files, 4)[0]
    # ACDC's HDF5 files carry spacing only, so the sample is axis-aligned at the origin.
    geometry = ImageGeometry(case.spacing, (0.0, 0.0, 0.0), (1, 0, 0, 0, 1, 0, 0, 0, 1))
    SAMPLE_DIR.mkdir(parents=True, exist_ok=True)
    write_image(SAMPLE_DIR / "acdc_patient_image.nii.gz", case.image.astype("float32"), geometry)
    write_image(SAMPLE_DIR / "acdc_patient_labels.nii.gz", case.label.astype("uint8"), geometry)
    return case, geometry


def write_sample_data(metadata) -> None:
    """The module's sample volume, its reference labelmap and its reference segmentation."""
    case, geometry = write_sample_volumes()
    write_reference_segmentation(case.label, geometry, metadata.class_names, metadata.class_colors,
                                 SAMPLE_DIR / "acdc_patient_reference.seg.nrrd")


def picture_case(bundle_path: Path, data: Path, name: str) -> tuple[Case, float]:
    """The test volume to show and the model's mean Dice on it: ``name``, or the lowest-Dice one ("hardest")."""
    metadata = load_bundle(bundle_path).metadata
    test_patients = load_split(SPLITS_DIR / "acdc.json")["test"]
    files = [file for file in find_cases(data) if file.patient_id in test_patients]
    if name != "hardest":
        files = [file for file in files if file.case_id == name]
    if not files:
        raise SystemExit(f"error: no test volume {'' if name == 'hardest' else name + ' '}in {data}.")
    predictor = Predictor(bundle_path, device="cpu")
    scored = [(float(dice(predictor.predict(case.image, case.spacing).labels, case.label.astype("int64"),
                          metadata.num_classes).mean()), case.case_id, case)
              for case in load_cases(files, metadata.num_classes)]
    score, _, case = min(scored, key=lambda item: item[:2])
    return case, score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="shipped model name or bundle path for the picture")
    parser.add_argument("--picture-only", action="store_true", help="keep the sample data, redraw the picture")
    parser.add_argument("--picture-case", default="hardest",
                        help="test volume to show (e.g. patient069_frame01); default: the lowest-Dice one")
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "SampleData" / "ACDC",
                        help="ACDC folder to choose the picture's test volume from (default: the shipped sample)")
    arguments = parser.parse_args()
    bundle_path = resolve_bundle_path(arguments.model)
    metadata = load_bundle(bundle_path).metadata
    written = []
    if not arguments.picture_only:
        write_sample_data(metadata)
        written = sorted(SAMPLE_DIR.iterdir())
    case, score = picture_case(bundle_path, arguments.data, arguments.picture_case)
    picture = render_readme_picture(bundle_path, metadata, case, score)
    for path in written + [picture]:
        print(f"{path.relative_to(REPO_ROOT)}  {path.stat().st_size / 1e6:.2f} MB")


def render_readme_picture(bundle_path: Path, metadata, case: Case, score: float) -> Path:
    """The module's outputs for ``case`` (mean Dice ``score``) at its most uncertain slice, as a Slicer slice view
    shows them."""
    from Testing.mrml_standins import new_scene

    scene = new_scene()
    import slicer
    from CalibSegRunner import SegmentationRunner, input_and_review_text
    from scripts.render_slice_view import render_slice_view

    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", case.case_id)
    slicer.util.updateVolumeFromArray(volume, case.image.astype("float32"))
    volume.SetSpacing(*reversed(case.spacing))
    volume.CreateDefaultDisplayNodes()
    outputs = SegmentationRunner().run(volume, bundle_path, device="cpu")
    slice_index = outputs.summary["uncertain_slices"][0] if outputs.summary["uncertain_slices"] else None
    heading = (f"{case.case_id} (test patient), slice {slice_index} (its most uncertain), {bundle_path.stem}: "
               f"measured Dice {score:.2f}. {input_and_review_text(outputs.summary)}")
    title = "\n".join(textwrap.wrap(heading, 80))
    path, _ = render_slice_view(scene, volume, outputs, metadata.class_names, metadata.class_colors, PICTURE,
                                slice_index=slice_index, title=title, zoom=PICTURE_ZOOM)
    return path


if __name__ == "__main__":
    main()
