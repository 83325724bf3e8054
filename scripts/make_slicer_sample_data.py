"""Write the CalibSeg module's sample data from the shipped ACDC sample (rerun after changing either).

    .venv/bin/python scripts/make_slicer_sample_data.py --bundle runs/demo/model.calibseg

Writes into ``CalibSeg/Resources/SampleData/``: the end-diastolic frame of test patient
patient016 (never seen in training: ``Training/splits/acdc_sample.json``) as NIfTI with
ACDC's assumed spacing, its reference as a Slicer segmentation (``.seg.nrrd``, segments
named and coloured as the bundle's classes), and a copy of ``--bundle`` as the demo model.
It then runs the module's logic on that volume in a slicer-core MRML scene and renders the
slice view to ``docs/images/slice_view.png`` (the README's picture). Needs the slicer-core
package (installed by ``.[dev]``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "Testing"))

from CalibSegLib.bundle import load_bundle  # noqa: E402
from CalibSegLib.io import ImageGeometry, atomic_output, write_image  # noqa: E402
from Training.data import find_cases, load_cases  # noqa: E402
from Training.splits import select_patients  # noqa: E402

SAMPLE_DIR = REPO_ROOT / "CalibSeg" / "Resources" / "SampleData"
CASE = "patient016_frame01"


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
    parser.add_argument("--bundle", type=Path, required=True, help="demo bundle to ship beside the volume")
    arguments = parser.parse_args()
    metadata = load_bundle(arguments.bundle).metadata
    files = [case for case in select_patients(find_cases(REPO_ROOT / "SampleData" / "ACDC"), ["patient016"])
             if case.case_id == CASE]
    case = load_cases(files, metadata.num_classes)[0]
    # ACDC's HDF5 files carry spacing only, so the sample is axis-aligned at the origin.
    geometry = ImageGeometry(case.spacing, (0.0, 0.0, 0.0), (1, 0, 0, 0, 1, 0, 0, 0, 1))
    SAMPLE_DIR.mkdir(parents=True, exist_ok=True)
    write_image(SAMPLE_DIR / "acdc_patient_image.nii.gz", case.image.astype("float32"), geometry)
    write_reference_segmentation(case.label, geometry, metadata.class_names, metadata.class_colors,
                                 SAMPLE_DIR / "acdc_patient_reference.seg.nrrd")
    with atomic_output(SAMPLE_DIR / "acdc_demo.calibseg") as temporary:
        shutil.copyfile(arguments.bundle, temporary)
    picture = render_readme_picture(metadata)
    for path in sorted(SAMPLE_DIR.iterdir()) + [picture]:
        print(f"{path.relative_to(REPO_ROOT)}  {path.stat().st_size / 1e6:.2f} MB")


def render_readme_picture(metadata) -> Path:
    """The module's outputs for the sample volume and demo bundle, as a Slicer slice view shows them."""
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
    outputs = CalibSegLogic().run(volume, SAMPLE_DIR / "acdc_demo.calibseg", device="cpu")
    path, _ = render_slice_view(scene, volume, outputs, metadata.class_names, metadata.class_colors,
                                REPO_ROOT / "docs" / "images" / "slice_view.png",
                                title=f"{CASE} (test patient): confidence, predicted outlines")
    return path


if __name__ == "__main__":
    main()
