"""The CalibSeg module's work, without Qt: a bundle run on MRML nodes (``runner.py``), in the background
(``job.py``), on every loaded volume in turn (``batch.py``), its output nodes (``nodes.py``, ``volumes.py``,
``colors.py``), showing them in the views (``display.py``, needs the application) and the dependency check
(``install.py``).

Tested under pytest on a slicer-core scene; ``CalibSegLogic`` in ``CalibSeg.py`` is Slicer's module logic
and hands its runs to :class:`SegmentationRunner`.
"""

from .batch import BatchJob, BatchOutputs, batch_volumes, run_batch
from .install import install_missing, missing_packages
from .job import InferenceJob
from .runner import (CalibSegOutputs, CalibSegRequest, RunSettings, SegmentationRunner,
                     channel_choice_problem, input_and_review_text)

__all__ = ["SegmentationRunner", "RunSettings", "CalibSegRequest", "CalibSegOutputs", "InferenceJob", "BatchJob",
           "BatchOutputs", "batch_volumes", "run_batch", "missing_packages", "install_missing",
           "input_and_review_text", "channel_choice_problem"]
