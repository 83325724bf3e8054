"""What is known about ACDC (the Automated Cardiac Diagnosis Challenge): its classes, their colours and standard
codes, and the spacing its HDF5 files are read with.

ACDC's HDF5 files carry no spacing: every ACDC volume is taken to have :data:`ACDC_SPACING` (10 mm between slices,
1.5 × 1.5 mm in-plane), which is also the default training spacing, so ACDC slices are used at their native
resolution.
"""

from __future__ import annotations

__all__ = ["ACDC_SPACING", "ACDC_CLASS_NAMES", "ACDC_CLASS_COLORS", "ACDC_TERMINOLOGY"]

# The ACDC HDF5 files carry no spacing; ACDC's in-plane spacing is about 1.4–1.7 mm and its
# slice thickness 5–10 mm. Every ACDC volume is read with this one assumption: it decides
# HD95/ASD in mm and, with the default Preprocessing.target_spacing of 1.5 mm, that ACDC slices
# are trained on without resampling.
ACDC_SPACING: tuple[float, float, float] = (10.0, 1.5, 1.5)
ACDC_CLASS_NAMES: list[str] = ["background", "right ventricle", "myocardium", "left ventricle"]
# RGB in [0, 1], one per class of ACDC_CLASS_NAMES.
ACDC_CLASS_COLORS: list[tuple[float, float, float]] = [
    (0.0, 0.0, 0.0), (0.90, 0.30, 0.25), (0.30, 0.70, 0.35), (0.25, 0.45, 0.90),
]
# SNOMED CT codes of ACDC's structures (bundle.json's class_terminology, CalibSegLib.terminology): right and left
# ventricle from Slicer's Modules/Loadable/Terminologies/Resources/SegmentationCategoryTypeModifier-DICOM-Master.json
# (Slicer 583e9b37, "Anatomical Structure" 123037004; types 53085002 and 87878005), the myocardium from
# SlicerMONAIAuto3DSeg's MONAIAuto3DSeg/Resources/SegmentationCategoryTypeModifier-MONAIAuto3DSeg.term.json
# (9cdf2df4, 74281007, as SlicerTotalSegmentator's heart_myocardium), in the region 87878005 "Left Ventricle" of
# Slicer's AnatomicRegionAndModifier-DICOM-Master.json. ACDC's cavities are the ventricles' blood pools.
_ANATOMICAL_STRUCTURE = {"CodingSchemeDesignator": "SCT", "CodeValue": "123037004",
                         "CodeMeaning": "Anatomical Structure"}
_LEFT_VENTRICLE = {"CodingSchemeDesignator": "SCT", "CodeValue": "87878005", "CodeMeaning": "Left ventricle"}
_LEFT_VENTRICLE_REGION = {**_LEFT_VENTRICLE, "CodeMeaning": "Left Ventricle"}
ACDC_TERMINOLOGY: dict[str, dict[str, dict[str, str]]] = {
    "right ventricle": {"category": _ANATOMICAL_STRUCTURE, "type": {
        "CodingSchemeDesignator": "SCT", "CodeValue": "53085002", "CodeMeaning": "Right ventricle"}},
    "myocardium": {"category": _ANATOMICAL_STRUCTURE, "type": {
        "CodingSchemeDesignator": "SCT", "CodeValue": "74281007", "CodeMeaning": "Myocardium"},
        "region": _LEFT_VENTRICLE_REGION},
    "left ventricle": {"category": _ANATOMICAL_STRUCTURE, "type": _LEFT_VENTRICLE},
}
