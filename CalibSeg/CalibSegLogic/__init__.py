"""Qt-free logic of the CalibSeg Slicer module (MRML nodes <-> CalibSegLib)."""

from .install import install_missing, missing_packages
from .job import InferenceJob
from .logic import CalibSegComputation, CalibSegLogic, CalibSegOutputs, CalibSegRequest, review_text

__all__ = ["CalibSegLogic", "CalibSegRequest", "CalibSegComputation", "CalibSegOutputs", "InferenceJob",
           "missing_packages", "install_missing", "review_text"]
