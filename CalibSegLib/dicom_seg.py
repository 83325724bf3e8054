"""DICOM out: the labels as a DICOM Segmentation and the confidence as a DICOM Parametric Map, with highdicom.

Both reference the source series they were predicted from (one frame per source slice, its position and
orientation taken from that slice) and identify the algorithm: the Segmentation's every segment carries an
Algorithm Identification (name ``CalibSeg``, family Artificial Intelligence (DCM 123110), the library version,
and as parameters the bundle, its method and weights checksum), and both objects name the bundle as the
equipment's model (Manufacturer ``CalibSeg``, Manufacturer's Model Name the bundle, Device Serial Number the
first 16 hex digits of its weights' SHA-256).

**Segments.** One per foreground class, numbered as the class, labelled with its name, its category, type,
type modifier, anatomic region and region modifier the bundle's SNOMED CT codes
(:mod:`CalibSegLib.terminology`; a class without an entry gets Slicer's generic "Tissue", SCT 85756007, for
both), and its colour as Recommended Display CIELab Value. The standard has no coded place for a per-segment
quality estimate, so the predicted Dice, its interval and the review flag go as text into each segment's
Segment Description (0062,0006), e.g. ``predicted Dice 0.91 [0.85, 0.97], ok``; the numbers stay in the case's
summary JSON.

**Source.** The source is a series of single-frame images in the volume's z order, or one multi-frame image
(Enhanced MR) whose frames the arrays follow (:func:`CalibSegLib.dicom.in_source_order`). highdicom takes a
multi-frame source only with its orientation among the shared functional groups; one that gives it per frame
(the reader has checked that every frame has the same) is handed to highdicom as a copy with it shared.
:func:`check_source` refuses, before any inference, a source no Segmentation can reference: a series without a
Frame of Reference UID (MR and CT images must have one, and highdicom refuses to make a Segmentation without
it). Refused rather than written without the SEG: the user asked for it, a run that ends well without it is
easily missed in a script, and the refusal costs no inference; without ``--dicom-seg`` the series is segmented.

**Confidence.** The maximum class probability in [0, 1], stored as 16-bit integers with a Real World Value
Mapping (slope 1/65535, unit "no units"), which more viewers display than float pixel data; the stored value
differs from the float32 confidence by at most 1/131070.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any, Sequence

import highdicom as hd
import numpy as np
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes

from CalibSegLib import __version__
from CalibSegLib.bundle import BundleMetadata
from CalibSegLib.terminology import CodedConcept, TerminologyEntry, parse_class_terminology

__all__ = ["ALGORITHM_NAME", "CONFIDENCE_SCALE", "GENERIC_TISSUE", "check_source", "segment_text",
           "segmentation_dataset", "confidence_dataset"]

ALGORITHM_NAME = "CalibSeg"
CONFIDENCE_SCALE = 65535  # stored value of confidence 1
# Slicer's fallback terminology for a segment without one: category and type "Tissue".
GENERIC_TISSUE = CodedConcept("SCT", "85756007", "Tissue")
# A derived series numbered far from the scanner's own (1, 2, ...), as converters commonly do.
SEGMENTATION_SERIES_NUMBER = 901
CONFIDENCE_SERIES_NUMBER = 902
_LONG_STRING = 64  # LO: Segment Label, Segment Description, Series Description


def check_source(source: Sequence[Dataset], label: str) -> None:
    """Refuse a source series (its headers, ``label`` naming it) that no Segmentation can reference.

    Raises:
        ValueError: the series has no Frame of Reference UID (see the module docstring).
    """
    if any(not header.get("FrameOfReferenceUID") for header in source):
        raise ValueError(f"--dicom-seg writes a DICOM Segmentation, which must share its source's Frame of "
                         f"Reference UID, and the DICOM {label} has none; leave out --dicom-seg (the NIfTI "
                         "outputs do not need it), or export the series with its Frame of Reference.")


def _highdicom_source(source: Sequence[Dataset]) -> list[Dataset]:
    """``source`` as highdicom takes it: a multi-frame image with its orientation shared (see the module
    docstring)."""
    image = source[0]
    if len(source) > 1 or "PerFrameFunctionalGroupsSequence" not in image:
        return list(source)
    if "PlaneOrientationSequence" in (image.get("SharedFunctionalGroupsSequence") or [Dataset()])[0]:
        return [image]
    image = deepcopy(image)
    if not image.get("SharedFunctionalGroupsSequence"):
        image.SharedFunctionalGroupsSequence = [Dataset()]
    frames = image.PerFrameFunctionalGroupsSequence
    image.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence = frames[0].PlaneOrientationSequence
    for frame in frames:
        del frame.PlaneOrientationSequence
    return [image]


def _code(concept: CodedConcept) -> hd.sr.CodedConcept:
    return hd.sr.CodedConcept(concept.value, concept.scheme, concept.meaning)


def _equipment(metadata: BundleMetadata, bundle_name: str) -> dict[str, Any]:
    """The equipment attributes both objects share: who made them, with which bundle."""
    return {"manufacturer": ALGORITHM_NAME, "manufacturer_model_name": bundle_name[:_LONG_STRING],
            "software_versions": __version__,
            "device_serial_number": (metadata.weights_sha256 or "unknown")[:16]}


def _algorithm(metadata: BundleMetadata, bundle_name: str) -> hd.AlgorithmIdentificationSequence:
    parameters = {"bundle": bundle_name, "method": str(metadata.training.get("method", "unknown")),
                  "weights_sha256": metadata.weights_sha256 or "unknown"}
    return hd.AlgorithmIdentificationSequence(
        name=ALGORITHM_NAME, family=codes.cid7162.ArtificialIntelligence, version=__version__,
        parameters=parameters)


def segment_text(entry: dict[str, Any]) -> str:
    """A structure's quality summary entry as a Segment Description: ``predicted Dice 0.91 [0.85, 0.97], ok``,
    ``..., REVIEW``; ``not found, REVIEW`` when predicted nowhere; ``no quality model`` without one."""
    flag = {True: "REVIEW", False: "ok", None: None}[entry.get("review")]
    if entry.get("predicted_dice") is not None:
        low, high = entry["predicted_dice_interval"]
        text = f"predicted Dice {entry['predicted_dice']:.2f} [{low:.2f}, {high:.2f}]"
    else:
        text = "not found" if entry.get("mean_confidence") is None else "no quality model"
    return f"{text}, {flag}" if flag else text


def _segment(number: int, name: str, color: Sequence[float], terminology: TerminologyEntry | None,
             algorithm: hd.AlgorithmIdentificationSequence, entry: dict[str, Any] | None
             ) -> hd.seg.SegmentDescription:
    """The description of class ``number``: its codes (see the module docstring), colour and quality text."""
    category = terminology.category if terminology else GENERIC_TISSUE
    kind = terminology.type if terminology else GENERIC_TISSUE
    region = terminology.region if terminology else None
    rgb = tuple(int(round(255 * min(max(float(value), 0.0), 1.0))) for value in color)
    description = hd.seg.SegmentDescription(
        segment_number=number, segment_label=name[:_LONG_STRING], segmented_property_category=_code(category),
        segmented_property_type=_code(kind), algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
        algorithm_identification=algorithm, tracking_id=name[:_LONG_STRING], tracking_uid=hd.UID(),
        anatomic_regions=[_code(region)] if region else None,
        display_color=hd.color.CIELabColor.from_rgb(*rgb))
    if terminology and terminology.type_modifier:
        description.SegmentedPropertyTypeCodeSequence[0].SegmentedPropertyTypeModifierCodeSequence = [
            _code(terminology.type_modifier)]
    if terminology and terminology.region_modifier:
        region_item = description.AnatomicRegionSequence[0]
        region_item.AnatomicRegionModifierSequence = [_code(terminology.region_modifier)]
    if entry is not None:
        description.SegmentDescription = segment_text(entry)[:_LONG_STRING]
    return description


def segmentation_dataset(labels: np.ndarray, source: Sequence[Dataset], metadata: BundleMetadata,
                         bundle_name: str, summary: dict[str, Any] | None = None) -> hd.seg.Segmentation:
    """A binary DICOM Segmentation of ``labels`` ``(z, y, x)`` (class indices, its slices in the source's order),
    one segment per foreground class.

    ``source``: the headers of the series' images (:func:`CalibSegLib.dicom.series_headers`; the volume's slices
    put in their order by :func:`CalibSegLib.dicom.in_source_order`); ``summary``: the case's quality summary,
    whose structures give each Segment Description.
    """
    algorithm = _algorithm(metadata, bundle_name)
    terminology = parse_class_terminology(metadata.class_terminology or {}, metadata.class_names)
    structures = (summary or {}).get("structures", {})
    segments = [_segment(number, name, metadata.class_colors[number], terminology.get(name), algorithm,
                         structures.get(name))
                for number, name in enumerate(metadata.class_names) if number > 0]
    flagged = sum(bool(entry.get("review")) for entry in structures.values())
    segmentation = hd.seg.Segmentation(
        source_images=_highdicom_source(source),
        pixel_array=np.ascontiguousarray(labels, dtype=np.uint8),
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY, segment_descriptions=segments,
        series_instance_uid=hd.UID(), series_number=SEGMENTATION_SERIES_NUMBER, sop_instance_uid=hd.UID(),
        instance_number=1, content_label="CALIBSEG",
        content_description=f"{len(structures)} structures, {flagged} flagged for review"[:_LONG_STRING],
        **_equipment(metadata, bundle_name))
    segmentation.SeriesDescription = f"{ALGORITHM_NAME} {bundle_name}"[:_LONG_STRING]
    return segmentation


def confidence_dataset(confidence: np.ndarray, source: Sequence[Dataset], metadata: BundleMetadata,
                       bundle_name: str) -> hd.pm.ParametricMap:
    """A DICOM Parametric Map of ``confidence`` ``(z, y, x)`` in [0, 1] on the source series' grid (its slices in
    the source's order, as for :func:`segmentation_dataset`; 16-bit stored values, see the module docstring)."""
    stored = np.rint(np.clip(confidence, 0.0, 1.0) * CONFIDENCE_SCALE).astype(np.uint16)
    mapping = hd.pm.RealWorldValueMapping(
        lut_label="CONFIDENCE", lut_explanation="maximum class probability", unit=codes.UCUM.NoUnits,
        value_range=(0, CONFIDENCE_SCALE), slope=1.0 / CONFIDENCE_SCALE, intercept=0.0)
    parametric_map = hd.pm.ParametricMap(
        source_images=_highdicom_source(source), pixel_array=stored, series_instance_uid=hd.UID(),
        series_number=CONFIDENCE_SERIES_NUMBER, sop_instance_uid=hd.UID(), instance_number=1,
        contains_recognizable_visual_features=False, real_world_value_mappings=[mapping],
        voi_lut_transformations=[hd.VOILUTTransformation(window_center=CONFIDENCE_SCALE / 2,
                                                         window_width=CONFIDENCE_SCALE)],
        content_label="CONFIDENCE",
        content_description=f"{ALGORITHM_NAME} {bundle_name} confidence"[:_LONG_STRING],
        **_equipment(metadata, bundle_name))
    parametric_map.SeriesDescription = f"{ALGORITHM_NAME} {bundle_name} confidence"[:_LONG_STRING]
    return parametric_map

