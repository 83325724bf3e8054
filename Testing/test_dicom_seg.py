"""DICOM out (``CalibSegLib.dicom_seg``): ``calibseg-predict --dicom-seg`` on a DICOM series writes a
Segmentation that highdicom and pydicom read back with the voxels of the labels, the bundle's SNOMED CT codes
and colours, the source series referenced and the algorithm identified, and a confidence Parametric Map on the
same frames."""

from __future__ import annotations

import json

import highdicom as hd
import numpy as np
import pydicom
import pytest

from CalibSegLib import __version__
from CalibSegLib.dicom import find_series
from CalibSegLib.dicom_seg import CONFIDENCE_SCALE, segment_text
from CalibSegLib.io import ImageGeometry, read_image
from CalibSegLib.predict import main
from Datasets.acdc import ACDC_CLASS_COLORS, ACDC_CLASS_NAMES, ACDC_TERMINOLOGY
from Datasets.dicom_series import write_series
from tiny_bundles import make_test_bundle

GRID = ImageGeometry((6.0, 1.25, 1.1), (-40.0, 12.5, 7.0), (0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0))
# One class with every optional part of a terminology entry, so each reaches the file.
TERMINOLOGY = dict(ACDC_TERMINOLOGY, **{"left ventricle": dict(
    ACDC_TERMINOLOGY["left ventricle"],
    type_modifier={"CodingSchemeDesignator": "SCT", "CodeValue": "7771000", "CodeMeaning": "Left"},
    region={"CodingSchemeDesignator": "SCT", "CodeValue": "80891009", "CodeMeaning": "Heart"},
    region_modifier={"CodingSchemeDesignator": "SCT", "CodeValue": "255503000", "CodeMeaning": "Entire"})})


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A DICOM series predicted with --dicom-seg by a bundle carrying ACDC's classes and codes: (folder,
    out)."""
    folder = tmp_path_factory.mktemp("seg")
    image = np.random.default_rng(5).normal(300, 80, size=(4, 30, 26)).astype(np.float32)
    image[:, 8:20, 6:18] += 400
    write_series(folder / "series", np.rint(image), GRID)
    make_test_bundle(folder / "model.calibseg", class_names=list(ACDC_CLASS_NAMES),
                     class_colors=list(ACDC_CLASS_COLORS), class_terminology=TERMINOLOGY)
    assert main(["--bundle", str(folder / "model.calibseg"), "--image", str(folder / "series"), "--out-dir",
                 str(folder / "out"), "--dicom-seg", "--device", "cpu", "--batch-size", "2"]) == 0
    return folder / "series", folder / "out"


def test_the_segmentation_holds_the_labels_voxels_and_references_the_source_series(written):
    folder, out = written
    series = find_series(folder)[0]
    labels, _ = read_image(out / "series_labels.nii.gz")
    segmentation = hd.seg.segread(out / "series_seg.dcm")
    assert segmentation.ReferencedSeriesSequence[0].SeriesInstanceUID == series.uid
    sources = [pydicom.dcmread(path, stop_before_pixels=True) for path in series.files]
    assert segmentation.StudyInstanceUID == sources[0].StudyInstanceUID
    assert segmentation.FrameOfReferenceUID == sources[0].FrameOfReferenceUID
    read = segmentation.get_pixels_by_source_instance([source.SOPInstanceUID for source in sources],
                                                      combine_segments=True)
    np.testing.assert_array_equal(read, labels)
    assert set(np.unique(labels)) > {0}  # the check sees structures, not an empty volume


def test_every_segment_carries_the_bundles_codes_colour_and_quality(written):
    _, out = written
    raw = pydicom.dcmread(out / "series_seg.dcm")  # read as plain DICOM, without highdicom
    assert raw.SOPClassUID == "1.2.840.10008.5.1.4.1.1.66.4" and raw.SegmentationType == "BINARY"
    summary = json.loads((out / "series_summary.json").read_text())
    segments = {item.SegmentLabel: item for item in raw.SegmentSequence}
    assert list(segments) == ACDC_CLASS_NAMES[1:]
    for number, name in enumerate(ACDC_CLASS_NAMES[1:], start=1):
        item, codes = segments[name], TERMINOLOGY[name]
        assert item.SegmentNumber == number and item.SegmentAlgorithmType == "AUTOMATIC"
        for sequence, part in (("SegmentedPropertyCategoryCodeSequence", "category"),
                               ("SegmentedPropertyTypeCodeSequence", "type")):
            concept = getattr(item, sequence)[0]
            assert (concept.CodingSchemeDesignator, concept.CodeValue, concept.CodeMeaning) == tuple(
                codes[part][key] for key in ("CodingSchemeDesignator", "CodeValue", "CodeMeaning"))
        rgb = hd.color.CIELabColor.from_dicom_value(list(item.RecommendedDisplayCIELabValue)).to_rgb()
        assert np.allclose(np.array(rgb) / 255, ACDC_CLASS_COLORS[number], atol=2 / 255)
        algorithm = item.SegmentationAlgorithmIdentificationSequence[0]
        assert (algorithm.AlgorithmName, algorithm.AlgorithmVersion) == ("CalibSeg", __version__)
        assert "model.calibseg" in algorithm.AlgorithmParameters
        assert item.SegmentDescription == segment_text(summary["structures"][name])
    left = segments["left ventricle"]
    modifier = left.SegmentedPropertyTypeCodeSequence[0].SegmentedPropertyTypeModifierCodeSequence[0]
    assert modifier.CodeValue == "7771000"
    assert left.AnatomicRegionSequence[0].CodeValue == "80891009"
    assert left.AnatomicRegionSequence[0].AnatomicRegionModifierSequence[0].CodeValue == "255503000"
    assert segments["myocardium"].AnatomicRegionSequence[0].CodeValue == "87878005"
    assert raw.ManufacturerModelName == "model.calibseg" and raw.Manufacturer == "CalibSeg"


def test_the_confidence_parametric_map_holds_the_confidence_on_the_source_frames(written):
    folder, out = written
    series = find_series(folder)[0]
    confidence, _ = read_image(out / "series_confidence.nii.gz")
    parametric_map = pydicom.dcmread(out / "series_confidence.dcm")
    assert parametric_map.SOPClassUID == "1.2.840.10008.5.1.4.1.1.30"
    assert parametric_map.ReferencedSeriesSequence[0].SeriesInstanceUID == series.uid
    mapping = parametric_map.SharedFunctionalGroupsSequence[0].RealWorldValueMappingSequence[0]
    stored = parametric_map.pixel_array.astype(np.float64)
    # Each frame lies at a source slice's position (highdicom may order them otherwise) and holds its
    # confidence.
    headers = [pydicom.dcmread(path, stop_before_pixels=True) for path in series.files]
    sources = [tuple(float(value) for value in header.ImagePositionPatient) for header in headers]
    frames = [sources.index(tuple(map(float, frame.PlanePositionSequence[0].ImagePositionPatient)))
              for frame in parametric_map.PerFrameFunctionalGroupsSequence]
    assert sorted(frames) == list(range(len(sources)))
    values = stored * float(mapping.RealWorldValueSlope) + float(mapping.RealWorldValueIntercept)
    assert float(mapping.RealWorldValueSlope) == pytest.approx(1 / CONFIDENCE_SCALE)
    np.testing.assert_allclose(values, confidence[frames], atol=0.5 / CONFIDENCE_SCALE + 1e-7)


def test_a_class_without_terminology_gets_the_generic_tissue_code(tmp_path):
    write_series(tmp_path / "series", np.rint(np.random.default_rng(6).normal(300, 80, size=(3, 24, 20))),
                 GRID)
    make_test_bundle(tmp_path / "model.calibseg")  # classes "class 1" ... without codes
    assert main(["--bundle", str(tmp_path / "model.calibseg"), "--image", str(tmp_path / "series"),
                 "--out-dir", str(tmp_path / "out"), "--dicom-seg", "--device", "cpu"]) == 0
    raw = pydicom.dcmread(tmp_path / "out" / "series_seg.dcm")
    for item in raw.SegmentSequence:
        assert item.SegmentedPropertyTypeCodeSequence[0].CodeValue == "85756007"
        assert item.SegmentedPropertyCategoryCodeSequence[0].CodeMeaning == "Tissue"


@pytest.mark.parametrize("entry, text", [
    ({"predicted_dice": 0.912, "predicted_dice_interval": [0.85, 0.97], "review": False,
      "mean_confidence": 0.9},
     "predicted Dice 0.91 [0.85, 0.97], ok"),
    ({"predicted_dice": 0.62, "predicted_dice_interval": [0.5, 0.7], "review": True, "mean_confidence": 0.7},
     "predicted Dice 0.62 [0.50, 0.70], REVIEW"),
    ({"predicted_dice": None, "predicted_dice_interval": None, "review": True, "mean_confidence": None},
     "not found, REVIEW"),
    ({"predicted_dice": None, "predicted_dice_interval": None, "review": None, "mean_confidence": 0.8},
     "no quality model"),
])
def test_segment_text(entry, text):
    assert segment_text(entry) == text


def test_the_slicer_modules_imports_need_neither_highdicom_nor_the_report(repo_root):
    """The Slicer module imports CalibSegLib.predict (batch_row) where highdicom is not installed."""
    import subprocess
    import sys

    code = ("import sys, CalibSegLib.predict, CalibSegLib.analysis_process; "
            "print(sorted({'highdicom', 'CalibSegLib.dicom_seg', 'CalibSegLib.report'} & set(sys.modules)))")
    printed = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True,
                             check=True)
    assert printed.stdout.strip() == "[]"
