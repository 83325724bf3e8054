"""The CalibSeg module's work, without Qt: a bundle run on MRML nodes (``runner.py``), in the background
(``job.py``), its output nodes (``nodes.py``, ``volumes.py``, ``colors.py``), showing them in the views
(``display.py``, needs the application) and the dependency check (``install.py``).

Tested under pytest on a slicer-core scene; ``CalibSegLogic`` in ``CalibSeg.py`` is Slicer's module logic
and hands its runs to :class:`SegmentationRunner`.
"""

from .install import install_missing, missing_packages
from .job import InferenceJob
from .runner import CalibSegOutputs, CalibSegRequest, SegmentationRunner, review_text

__all__ = ["SegmentationRunner", "CalibSegRequest", "CalibSegOutputs", "InferenceJob",
           "missing_packages", "install_missing", "review_text"]
