"""The CalibSeg module's work, without Qt: a bundle run on MRML nodes (``runner.py``), in the background
(``job.py``), on every loaded volume in turn (``batch.py``), cardiac function from an ED and an ES volume or a cine
(``function.py``, its phases read by ``phases.py``), its output nodes (``nodes.py``, ``volumes.py``,
``colors.py``), showing them in the views (``display.py``, needs the application) and the dependency check
(``install.py``).

Tested under pytest on a slicer-core scene; ``CalibSegLogic`` in ``CalibSeg.py`` is Slicer's module logic
and hands its runs to :class:`SegmentationRunner`.
"""

from .batch import BatchJob, BatchOutputs, batch_volumes, run_batch
from .function import FunctionJob, FunctionOutputs, FunctionRequest, FunctionRunner
from .install import install_missing, missing_packages
from .job import InferenceJob
from .phases import Phases, cine_phases, ed_es_phases, is_cine_node
from .runner import (CalibSegOutputs, CalibSegRequest, RunSettings, SegmentationRunner,
                     channel_choice_problem, input_and_review_text)

__all__ = ["SegmentationRunner", "RunSettings", "CalibSegRequest", "CalibSegOutputs", "InferenceJob", "BatchJob",
           "BatchOutputs", "batch_volumes", "run_batch", "missing_packages", "install_missing",
           "input_and_review_text", "channel_choice_problem", "FunctionRunner", "FunctionRequest", "FunctionOutputs",
           "FunctionJob", "Phases", "ed_es_phases", "cine_phases", "is_cine_node"]
