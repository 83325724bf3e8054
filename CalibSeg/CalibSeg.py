"""CalibSeg: segmentation with per-voxel confidence and uncertainty, and a check of whether they are honest.

Slicer's scripted-module template: ``CalibSeg`` (metadata, help, sample data), ``CalibSegWidget``
(thin: binds ``Resources/UI/CalibSeg.ui`` to ``CalibSegParameterNode``, starts an
:class:`~CalibSegRunner.InferenceJob` and polls it from a timer, so the GUI never waits on the
network), ``CalibSegLogic`` (the parameter node; every run goes to the Qt-free
:class:`~CalibSegRunner.SegmentationRunner`) and ``CalibSegTest``. From Slicer's Python console::

    logic = slicer.util.getModuleLogic("CalibSeg")
    outputs = logic.run(getNode("ACDC patient"), "acdc_crac",  # or a path to a .calibseg file
                        referenceNode=getNode("ACDC patient reference"))
    batch = logic.runBatch("acdc_crac")  # every loaded volume in turn; batch.rows, batch.summary_table
    function = logic.cardiacFunction("acdc_ce_dice", getNode("ED"), getNode("ES"), outputFolder="/tmp/heart")
    cine = logic.cardiacFunctionCine("acdc_ce_dice", getNode("cine"))  # a Sequence or MultiVolume node
    function.function["lv_ef_percent"], cine.function["phases"]  # function.json's dictionary
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

import qt
import slicer
import vtk
from slicer.parameterNodeWrapper import Choice, WithinRange, parameterNodeWrapper
from slicer.ScriptedLoadableModule import (
    ScriptedLoadableModule,
    ScriptedLoadableModuleLogic,
    ScriptedLoadableModuleTest,
    ScriptedLoadableModuleWidget,
)
from slicer.util import VTKObservationMixin

from CalibSegLib.pretrained import DEFAULT_MODEL, pretrained_models
from CalibSegLib.uncertainty_levels import HOT_SPOT_LEVEL, LOW_CONFIDENCE_THRESHOLD
from CalibSegRunner import (BatchJob, BatchOutputs, CalibSegOutputs, CalibSegRequest, FunctionJob, FunctionOutputs,
                            FunctionRunner, InferenceJob, SegmentationRunner, batch_volumes, channel_choice_problem,
                            cine_phases, ed_es_phases, install_missing, missing_packages, input_and_review_text,
                            run_batch)
from CalibSegRunner.display import show_function, show_outputs, show_table
from CalibSegRunner.function import function_text

MODULE_DIR = Path(__file__).resolve().parent
SAMPLE_DIR = MODULE_DIR / "Resources" / "SampleData"
POLL_INTERVAL_MS = 100
SCENE_CLOSE_WAIT_S = 10  # how long closing the scene waits for a cancelled batch's child to end


class CalibSeg(ScriptedLoadableModule):
    """Module metadata and help, shown in Slicer's module panel."""

    def __init__(self, parent):
        ScriptedLoadableModule.__init__(self, parent)
        self.parent.title = "CalibSeg"
        self.parent.categories = ["Segmentation"]
        self.parent.dependencies = []
        self.parent.contributors = ["CalibSeg contributors"]
        self.parent.helpText = """
Segments a volume with a CalibSeg model bundle (<code>.calibseg</code>) and shows, voxel by voxel,
how sure the model is: <b>confidence</b> (largest class probability, viridis) and <b>uncertainty</b>
(normalised entropy, inferno), both on a fixed 0–1 scale; the uncertainty is drawn only at its
<b>hot spots</b> (entropy above the chosen level), so the anatomy stays visible. Without any reference
the <b>quality table</b> lists per structure its volume, mean confidence and entropy, a <b>predicted
Dice</b> with an interval and a <b>REVIEW</b> marker (predicted Dice below the model's review
threshold, which each bundle carries), and the <b>most uncertain slices</b> are listed: select one to jump
there. The <i>low-confidence</i> segment marks voxels below the chosen threshold. With <i>Segment all loaded
volumes</i>, Run segments every loaded
volume in turn (one progress for the batch; Cancel keeps the volumes finished so far) and adds a summary table
over them. With a reference segmentation the module reports Dice, HD95 and
ASD per class and the calibration metrics ECE, class-wise ECE, TACE, Brier score and NLL, and draws
a reliability diagram. Ready-to-use cardiac MRI models (CE+Dice, NACL, CRaC, trained on ACDC) ship
with the module and the CE+Dice one, chosen on the validation patients for its Dice and its review
flag on degraded input, is preselected; others
are trained with <code>calibseg-train</code> (CRaC, NACL, MbLS and baselines).
<b>Cardiac function</b> measures, from an end-diastolic and an end-systolic volume or from a cine (a 4D sequence,
ED and ES chosen as the largest and smallest LV blood pool), the LV and RV volumes and ejection fractions and the
myocardial mass, each with its 90 % interval, and can write them as <code>function.json</code> with a report page.
"""
        self.parent.acknowledgementText = """
Methods: Murugesan et al., CRaC (class and region-adaptive constraints), 2024;
Murugesan et al., NACL (neighbour-aware calibration loss), MICCAI 2023 / MedIA 2024;
Liu et al., MbLS (margin-based label smoothing), CVPR 2022. Sample data: ACDC,
Bernard et al., IEEE TMI 37(11), 2018.
"""
        slicer.app.connect("startupCompleted()", register_sample_data)


def register_sample_data() -> None:
    """Add the shipped ACDC volume and its reference to the Sample Data module."""
    import SampleData

    SampleData.SampleDataLogic.registerCustomSampleDataSource(
        category="CalibSeg",
        sampleName="CalibSeg ACDC cardiac MRI",
        thumbnailFileName=str(MODULE_DIR / "Resources" / "Icons" / "CalibSeg.png"),
        uris=[(SAMPLE_DIR / name).as_uri()
              for name in ("acdc_patient_image.nii.gz", "acdc_patient_reference.seg.nrrd")],
        fileNames=["acdc_patient_image.nii.gz", "acdc_patient_reference.seg.nrrd"],
        nodeNames=["ACDC patient", "ACDC patient reference"],
        loadFileType=["VolumeFile", "SegmentationFile"],
    )


@parameterNodeWrapper
class CalibSegParameterNode:
    """The module's state, saved with the scene."""

    inputVolume: slicer.vtkMRMLScalarVolumeNode
    referenceNode: slicer.vtkMRMLNode
    bundlePath: Path
    device: Annotated[str, Choice(["auto", "cpu", "cuda"])] = "auto"
    showLowConfidence: bool = False
    lowConfidenceThreshold: Annotated[float, WithinRange(0.0, 1.0)] = LOW_CONFIDENCE_THRESHOLD
    hotSpotLevel: Annotated[float, WithinRange(0.0, 1.0)] = HOT_SPOT_LEVEL
    segmentAllVolumes: bool = False  # Run segments every loaded volume in turn (CalibSegRunner.batch)
    functionFromCine: bool = False  # cardiac function of cineNode rather than of edVolume and esVolume
    edVolume: slicer.vtkMRMLScalarVolumeNode
    esVolume: slicer.vtkMRMLScalarVolumeNode
    cineNode: slicer.vtkMRMLNode  # a Sequence node, or a MultiVolume node (MultiVolumeExplorer's)
    functionOutputFolder: Path  # function.json and report.html go there; none: not written


class CalibSegWidget(ScriptedLoadableModuleWidget, VTKObservationMixin):
    """GUI: inputs, Run/Cancel with progress, the low-confidence threshold, the hot-spot level and the
    most uncertain slices."""

    def __init__(self, parent=None) -> None:
        ScriptedLoadableModuleWidget.__init__(self, parent)
        VTKObservationMixin.__init__(self)
        self.logic = None
        self._parameterNode = None
        self._parameterNodeGuiTag = None
        self._job = None
        self._outputs = None
        self._timer = qt.QTimer()
        self._timer.setInterval(POLL_INTERVAL_MS)
        self._timer.connect("timeout()", self._poll)

    def setup(self) -> None:
        ScriptedLoadableModuleWidget.setup(self)
        uiWidget = slicer.util.loadUI(self.resourcePath("UI/CalibSeg.ui"))
        self.layout.addWidget(uiWidget)
        self.ui = slicer.util.childWidgetVariables(uiWidget)
        uiWidget.setMRMLScene(slicer.mrmlScene)
        self.logic = CalibSegLogic()

        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.StartCloseEvent, self.onSceneStartClose)
        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.EndCloseEvent, self.onSceneEndClose)
        self._channelSelectors = []
        self._channelNames = ["image"]
        self.ui.bundlePathLineEdit.connect("currentPathChanged(QString)", self._updateChannelSelectors)
        self.ui.inputVolumeSelector.connect("currentNodeChanged(vtkMRMLNode*)",
                                            lambda node: self._onChannelChosen(0))
        self.ui.runButton.connect("clicked(bool)", self.onRun)
        self.ui.cancelButton.connect("clicked(bool)", self.onCancel)
        self.ui.lowConfidenceSlider.connect("valueChanged(double)", self.onThresholdChanged)
        self.ui.lowConfidenceCheckBox.connect("toggled(bool)", self.onThresholdChanged)
        self.ui.hotSpotSlider.connect("valueChanged(double)", self.onHotSpotLevelChanged)
        self.ui.uncertainSlicesList.connect("currentRowChanged(int)", self.onUncertainSliceSelected)
        self.ui.functionButton.connect("clicked(bool)", self.onMeasureFunction)
        self.initializeParameterNode()

    def cleanup(self) -> None:
        self.onCancel()
        self.removeObservers()

    def enter(self) -> None:
        self.initializeParameterNode()

    def exit(self) -> None:
        if self._parameterNode:
            self._parameterNode.disconnectGui(self._parameterNodeGuiTag)
            self._parameterNodeGuiTag = None
            self.removeObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._updateButtons)

    def onSceneStartClose(self, caller, event) -> None:
        self.onCancel()
        if isinstance(self._job, BatchJob):  # dropped once its child ended: its summary table has no scene to go to
            self._job.wait(timeout=SCENE_CLOSE_WAIT_S)
            self._timer.stop()
            self._job = None
        self._outputs = None  # its nodes go with the scene
        self._showQuality(None)
        self.ui.functionLabel.text = ""
        self.setParameterNode(None)

    def onSceneEndClose(self, caller, event) -> None:
        if self.parent.isEntered:
            self.initializeParameterNode()

    def initializeParameterNode(self) -> None:
        self.setParameterNode(self.logic.getParameterNode())
        if not self._parameterNode.inputVolume:
            self._parameterNode.inputVolume = slicer.mrmlScene.GetFirstNodeByClass("vtkMRMLScalarVolumeNode")
        default_model = pretrained_models().get(DEFAULT_MODEL)
        if str(self._parameterNode.bundlePath) in ("", ".") and default_model:
            # A shipped ACDC model is ready to run; any other bundle can be picked instead.
            self._parameterNode.bundlePath = default_model

    def setParameterNode(self, inputParameterNode) -> None:
        if self._parameterNode:
            self._parameterNode.disconnectGui(self._parameterNodeGuiTag)
            self.removeObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._updateButtons)
        self._parameterNode = inputParameterNode
        if self._parameterNode:
            self._parameterNodeGuiTag = self._parameterNode.connectGui(self.ui)
            self.addObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._updateButtons)
        self._updateButtons()

    def _updateButtons(self, caller=None, event=None) -> None:
        running = self._job is not None
        parameters = self._parameterNode
        batch = bool(parameters and parameters.segmentAllVolumes)
        bundle = bool(parameters and parameters.bundlePath and str(parameters.bundlePath) not in ("", "."))
        ready = bundle and bool(batch or parameters.inputVolume)
        self.ui.runButton.enabled = ready and not running
        self.ui.runButton.toolTip = (("Segment every loaded volume in turn" if batch else
                                      "Segment the input with the bundle") if ready else
                                     "Select an input volume and a bundle")
        # a batch takes every loaded volume (a multi-channel model's grouped by name) and no reference
        self.ui.inputVolumeSelector.enabled = self.ui.referenceSelector.enabled = not batch
        self.ui.channelsWidget.enabled = not batch
        self.ui.cancelButton.enabled = running
        self.ui.progressBar.visible = running
        cine = bool(parameters and parameters.functionFromCine)
        self.ui.edVolumeSelector.enabled = self.ui.esVolumeSelector.enabled = not cine
        self.ui.cineSelector.enabled = cine
        phases = bool(parameters and (parameters.cineNode if cine else parameters.edVolume and parameters.esVolume))
        self.ui.functionButton.enabled = phases and bundle and not running

    def _updateChannelSelectors(self, bundlePath: str = "") -> None:
        """One volume selector per further input channel of the chosen bundle, labelled with its channel name (a
        one-channel bundle needs none); the input selector is the first channel."""
        layout = self.ui.channelsWidget.layout()
        while layout.rowCount():
            layout.removeRow(0)
        self._channelSelectors = []
        names = self._channelNames = self.logic.channelNames(bundlePath)
        self.ui.inputVolumeLabel.text = f"Input volume ({names[0]}):" if len(names) > 1 else "Input volume:"
        for name in names[1:]:
            selector = slicer.qMRMLNodeComboBox()
            selector.nodeTypes = ["vtkMRMLScalarVolumeNode"]
            selector.showChildNodeTypes = False
            selector.addEnabled = selector.removeEnabled = False
            selector.noneEnabled = True
            selector.setMRMLScene(slicer.mrmlScene)
            selector.toolTip = f"The volume of the model's '{name}' channel, on the input volume's grid."
            layout.addRow(f"{name}:", selector)
            self._channelSelectors.append(selector)
            channel = len(self._channelSelectors)
            selector.connect("currentNodeChanged(vtkMRMLNode*)",
                             lambda node, channel=channel: self._onChannelChosen(channel))
        self.ui.channelsWidget.visible = bool(self._channelSelectors)

    def _onChannelChosen(self, channel: int) -> None:
        """A volume picked for ``channel`` (0: the input selector) that another channel already has is
        refused: the selector goes back to none and a message says why
        (:func:`CalibSegRunner.channel_choice_problem`)."""
        selectors = [self.ui.inputVolumeSelector, *self._channelSelectors]
        if len(selectors) < 2:
            return
        chosen = [selector.currentNode() for selector in selectors]
        problem = channel_choice_problem(chosen, self._channelNames, changed=channel)
        if problem:
            selectors[channel].setCurrentNode(None)
            slicer.util.errorDisplay(problem, windowTitle="CalibSeg")

    def _start(self, startJob) -> bool:
        """Start the job ``startJob()`` returns and poll it; an expected failure is one sentence in a message (and
        False), with the scene untouched."""
        if missing_packages() and not install_missing(slicer.util.confirmOkCancelDisplay):
            self.ui.statusLabel.text = "CalibSeg needs PyTorch and MONAI; nothing was run."
            return False
        try:
            self._job = startJob()
        except Exception as error:  # every expected failure is one sentence; the scene is untouched
            self.ui.statusLabel.text = str(error)
            slicer.util.errorDisplay(str(error), windowTitle="CalibSeg")
            return False
        self.ui.statusLabel.text = "Running…"
        self.ui.progressBar.value = 0
        self._updateButtons()
        self._timer.start()
        return True

    def onRun(self) -> None:
        parameters = self._parameterNode
        threshold = parameters.lowConfidenceThreshold if parameters.showLowConfidence else None

        def startJob():
            if parameters.segmentAllVolumes:
                settings = self.logic.runner.settings(str(parameters.bundlePath), parameters.device, threshold,
                                                      parameters.hotSpotLevel)
                return BatchJob(self.logic.runner, batch_volumes(slicer.mrmlScene), settings).start()
            request = self.logic.prepare(parameters.inputVolume, str(parameters.bundlePath),
                                         parameters.referenceNode, parameters.device, threshold,
                                         parameters.hotSpotLevel,
                                         [selector.currentNode() for selector in self._channelSelectors])
            return InferenceJob(self.logic.runner, request).start()  # the network runs in a child process

        if self._start(startJob):
            self._showQuality(None)

    def onMeasureFunction(self) -> None:
        """Cardiac function of the chosen ED and ES volumes, or of the cine, in a child process."""
        parameters = self._parameterNode

        def startJob():
            phases = (cine_phases(parameters.cineNode) if parameters.functionFromCine
                      else ed_es_phases(parameters.edVolume, parameters.esVolume))
            request = self.logic.functionRunner.request(phases, str(parameters.bundlePath), parameters.device,
                                                        str(parameters.functionOutputFolder))
            return FunctionJob(request).start()

        self.ui.functionLabel.text = ""
        self._start(startJob)

    def onCancel(self) -> None:
        if self._job is not None:
            self._job.cancel()
            self.ui.statusLabel.text = "Cancelling…"

    def _poll(self) -> None:
        job = self._job
        batch = isinstance(job, BatchJob)
        if batch:
            job.advance()  # publishes a case whose child ended, starts the next
            self.ui.statusLabel.text = job.status_text
        self.ui.progressBar.value = int(100 * job.fraction)
        if not job.done():
            return
        self._timer.stop()
        self._job = None
        self._updateButtons()
        from CalibSegLib.inference import InferenceCancelled

        try:
            outputs = job.finish()  # a batch's raises only where the child refused the bundle: no case ran
        except InferenceCancelled:
            self.ui.statusLabel.text = "Cancelled; the scene is unchanged."
            return
        except Exception as error:
            self.ui.statusLabel.text = "Failed; the scene is unchanged."
            slicer.util.errorDisplay(str(error), windowTitle="CalibSeg")
            return
        if batch:
            self._showBatch(outputs)
            return
        if isinstance(job, FunctionJob):
            self._showFunction(outputs)
            return
        self._outputs = outputs
        show_outputs(self._outputs, job.request.input_node)
        self.ui.statusLabel.text = "Done." + (
            f" Dice {self._outputs.metrics['Dice mean']:.3f}, ECE {self._outputs.metrics['ECE']:.3f}"
            if self._outputs.metrics else "")
        self._showQuality(self._outputs.summary)

    def _showBatch(self, outputs: BatchOutputs) -> None:
        """The batch's summary table in the layout; the last segmented case in the views, as a single run's."""
        segmented = [case for case in outputs.cases if case.outputs is not None]
        self._outputs = segmented[-1].outputs if segmented else None
        if segmented:
            show_outputs(self._outputs, segmented[-1].volume)
        show_table(outputs.summary_table)
        self._showQuality(self._outputs and self._outputs.summary)

    def _showFunction(self, outputs: FunctionOutputs) -> None:
        """The indices with their intervals in the panel, the tables (and a cine's volume curve) in the layout."""
        self.ui.functionLabel.text = function_text(outputs.function)
        written = f" Written to {outputs.json_path.parent}." if outputs.json_path else ""
        self.ui.statusLabel.text = f"Done.{written}"
        show_function(outputs)

    def _showQuality(self, summary) -> None:
        """The review sentence and the most uncertain slices of the last run."""
        self.ui.reviewLabel.text = input_and_review_text(summary) if summary else ""
        self.ui.uncertainSlicesList.clear()
        for index in (summary or {}).get("uncertain_slices", []):
            self.ui.uncertainSlicesList.addItem(f"slice {index}")

    def onUncertainSliceSelected(self, row: int) -> None:
        if self._outputs is None or row < 0:
            return
        slices = self._outputs.summary["uncertain_slices"]
        # The uncertainty volume lies on the input's exact grid and stays the run's if the input selector moves.
        self.logic.jumpToSlice(self._outputs.uncertainty, slices[row], self._outputs.summary["slice_axis"])

    def onHotSpotLevelChanged(self, level: float) -> None:
        if self._outputs is not None and self._job is None:
            self.logic.setHotSpotLevel(self._outputs, level)

    def onThresholdChanged(self, *unused) -> None:
        if self._outputs is None or self._job is not None:
            return
        parameters = self._parameterNode
        threshold = parameters.lowConfidenceThreshold if parameters.showLowConfidence else 0.0
        # A threshold of 0 selects no voxel: the segment stays, empty, so toggling is cheap. The confidence volume
        # lies on the run's input grid, also after a batch, whose last case need not be the selected input.
        self.logic.updateLowConfidence(self._outputs, self._outputs.confidence, threshold)


class CalibSegLogic(ScriptedLoadableModuleLogic):
    """The module's logic: the GUI's state (its parameter node) and the runs, which it hands to the Qt-free
    :class:`~CalibSegRunner.SegmentationRunner` (the arguments and results are that class's)."""

    def __init__(self) -> None:
        ScriptedLoadableModuleLogic.__init__(self)
        self.runner = SegmentationRunner()
        self.functionRunner = FunctionRunner()

    def getParameterNode(self):
        return CalibSegParameterNode(super().getParameterNode())

    def cardiacFunction(self, bundlePath, edVolumeNode, esVolumeNode, device: str = "auto", outputFolder=None,
                        progress=None) -> FunctionOutputs:
        """Cardiac function of an end-diastolic and an end-systolic volume (on one grid) measured with a bundle (a
        ``.calibseg`` path or a shipped model's name), in the calling thread (the Python console): a table of the
        indices with their intervals and, with ``outputFolder``, ``function.json`` and ``report.html`` there.
        Raises ValueError with one sentence (volumes on different grids, a bundle without the heart's codes, ...),
        nothing added."""
        return self.functionRunner.run(ed_es_phases(edVolumeNode, esVolumeNode), bundlePath, device, outputFolder,
                                       progress)

    def cardiacFunctionCine(self, bundlePath, cineNode, device: str = "auto", outputFolder=None,
                            progress=None) -> FunctionOutputs:
        """Cardiac function of a cine (a Sequence or MultiVolume node of at least two phases on one grid), ED and
        ES chosen from its phases, as :meth:`cardiacFunction`; adds the phases' volume table and curve too."""
        return self.functionRunner.run(cine_phases(cineNode), bundlePath, device, outputFolder, progress)

    def prepare(self, inputVolumeNode, bundlePath, referenceNode=None, device: str = "auto",
                lowConfidenceThreshold: float | None = None, hotSpotLevel: float | None = None,
                channelNodes=()) -> CalibSegRequest:
        """Read and check what a run needs from the scene (main thread); one-sentence errors, nothing added.
        ``channelNodes``: a multi-channel bundle's other channels, in its ``channel_names`` order."""
        return self.runner.prepare(inputVolumeNode, bundlePath, referenceNode, device, lowConfidenceThreshold,
                                   hotSpotLevel, channelNodes)

    @staticmethod
    def channelNames(bundlePath: str) -> list[str]:
        """The input channels a bundle reads, in order (``["image"]`` for one, or when the bundle cannot be read:
        Run then says why); from its metadata alone, never its weights."""
        from CalibSegLib.bundle import read_metadata
        from CalibSegLib.channels import input_names
        from CalibSegLib.pretrained import resolve_bundle_path

        try:
            metadata = read_metadata(resolve_bundle_path(bundlePath))
        except (ValueError, OSError):
            return ["image"]
        return input_names(metadata)

    def run(self, inputVolumeNode, bundlePath, referenceNode=None, device: str = "auto",
            lowConfidenceThreshold: float | None = None, progress=None, cancel=None,
            hotSpotLevel: float | None = None, channelNodes=()) -> CalibSegOutputs:
        """Segment ``inputVolumeNode`` (with ``channelNodes``, a multi-channel bundle's other channels) with a bundle
        (a ``.calibseg`` path or a shipped model's name) and add the output nodes, in the calling thread (the Python
        console)."""
        return self.runner.run(inputVolumeNode, bundlePath, referenceNode, device, lowConfidenceThreshold, progress,
                               cancel, hotSpotLevel, channelNodes)

    def runBatch(self, bundlePath, volumeNodes=None, device: str = "auto",
                 lowConfidenceThreshold: float | None = None, hotSpotLevel: float | None = None,
                 progress=None) -> BatchOutputs:
        """Segment ``volumeNodes`` (default: every loaded volume, :func:`~CalibSegRunner.batch_volumes`) in turn,
        each in a child process, and add every case's outputs and one summary table, in the calling thread (the
        Python console); ``progress(fraction)`` for the whole batch."""
        volumes = batch_volumes(slicer.mrmlScene) if volumeNodes is None else volumeNodes
        return run_batch(volumes, bundlePath, device, lowConfidenceThreshold, hotSpotLevel, progress, self.runner)

    def updateLowConfidence(self, outputs: CalibSegOutputs, inputVolumeNode, threshold: float) -> None:
        self.runner.updateLowConfidence(outputs, inputVolumeNode, threshold)

    def setHotSpotLevel(self, outputs: CalibSegOutputs, level: float) -> None:
        self.runner.setHotSpotLevel(outputs, level)

    def jumpToSlice(self, volumeNode, sliceIndex: int, sliceAxis: int = 0):
        return self.runner.jumpToSlice(volumeNode, sliceIndex, sliceAxis)


class CalibSegTest(ScriptedLoadableModuleTest):
    """Runs the checks of ``CalibSegTesting`` (the ones pytest runs on slicer-core) in Slicer's own scene."""

    def runTest(self) -> None:
        from CalibSegTesting import CHECKS

        with tempfile.TemporaryDirectory(prefix="CalibSegTest") as work_dir:
            for name, check in CHECKS.items():
                slicer.mrmlScene.Clear(0)
                self.delayDisplay(f"Checking: {name.replace('_', ' ')}")
                check_dir = os.path.join(work_dir, name)
                os.makedirs(check_dir)
                check(slicer.mrmlScene, Path(check_dir))
        self.delayDisplay("All CalibSeg checks passed")
