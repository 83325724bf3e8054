"""Write the CalibSeg module's sample data from the shipped ACDC sample (rerun after changing either).

    .venv/bin/python scripts/make_slicer_sample_data.py [--model acdc_crac]

Writes into ``CalibSeg/Resources/SampleData/``: the end-diastolic frame of patient069, a test
patient of both ``Training/splits/acdc.json`` (so the shipped models never saw it) and, as a
validation patient, of ``acdc_sample.json``, as NIfTI with ACDC's assumed spacing, and its
reference as a Slicer segmentation (``.seg.nrrd``, segments named and coloured as the model's
classes). It then runs the module's logic with ``--model`` (a shipped model's name or a bundle
path; default :data:`CalibSegLib.pretrained.DEFAULT_MODEL`) on that volume in a slicer-core MRML
scene and renders the slice view to ``docs/images/slice_view.png`` (the README's picture).
Needs the slicer-core package (installed by ``.[dev]``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "Testing"))

from CalibSegLib.bundle import load_bundle  # noqa: E402
from CalibSegLib.io import ImageGeometry, atomic_output, write_image  # noqa: E402
from CalibSegLib.pretrained import DEFAULT_MODEL, resolve_bundle_path  # noqa: E402
from Training.data import find_cases, load_cases  # noqa: E402
from Training.splits import select_patients  # noqa: E402

SAMPLE_DIR = REPO_ROOT / "CalibSeg" / "Resources" / "SampleData"
CASE = "patient069_frame01"


def write_reference_segmentation(labels, geometry: ImageGeometry, class_names, class_colors, path: Path) -> None:
    """A .seg.nrrd with one named, coloured segment per foreground class, made with Slicer's own MRML classes."""
    from mrml_standins import install_standins

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="shipped model name or bundle path for the picture")
    arguments = parser.parse_args()
    bundle_path = resolve_bundle_path(arguments.model)
    metadata = load_bundle(bundle_path).metadata
    files = [case for case in select_patients(find_cases(REPO_ROOT / "SampleData" / "ACDC"), [CASE.split("_")[0]])
             if case.case_id == CASE]
    case = load_cases(files, metadata.num_classes)[0]
    # ACDC's HDF5 files carry spacing only, so the sample is axis-aligned at the origin.
    geometry = ImageGeometry(case.spacing, (0.0, 0.0, 0.0), (1, 0, 0, 0, 1, 0, 0, 0, 1))
    SAMPLE_DIR.mkdir(parents=True, exist_ok=True)
    write_image(SAMPLE_DIR / "acdc_patient_image.nii.gz", case.image.astype("float32"), geometry)
    write_reference_segmentation(case.label, geometry, metadata.class_names, metadata.class_colors,
                                 SAMPLE_DIR / "acdc_patient_reference.seg.nrrd")
    picture = render_readme_picture(bundle_path, metadata)
    for path in sorted(SAMPLE_DIR.iterdir()) + [picture]:
        print(f"{path.relative_to(REPO_ROOT)}  {path.stat().st_size / 1e6:.2f} MB")


def render_readme_picture(bundle_path: Path, metadata) -> Path:
    """The module's outputs for the sample volume and a shipped model, as a Slicer slice view shows them."""
    from mrml_standins import new_scene

    scene = new_scene()
    import slicer
    from CalibSegLogic import CalibSegLogic
    from CalibSegTesting.render import render_slice_view

    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "ACDC patient")
    storage = slicer.vtkMRMLVolumeArchetypeStorageNode()
    storage.SetFileName(str(SAMPLE_DIR / "acdc_patient_image.nii.gz"))
    storage.ReadData(volume)
    volume.CreateDefaultDisplayNodes()
    outputs = CalibSegLogic().run(volume, bundle_path, device="cpu")
    path, _ = render_slice_view(scene, volume, outputs, metadata.class_names, metadata.class_colors,
                                REPO_ROOT / "docs" / "images" / "slice_view.png",
                                title=f"{CASE} (test patient), {bundle_path.stem}: confidence, predicted outlines")
    return path


if __name__ == "__main__":
    main()
