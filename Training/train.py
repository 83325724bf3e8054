"""Train a segmentation network with a calibration-aware loss and write a model bundle.

    calibseg-train                                          # CRaC on the shipped sample, quick CPU schedule
    calibseg-train --cpu --data data/full --method ce_dice  # the full cardiac dataset on a CPU, ≤ 60 min
    calibseg-train --paper --data data/full --method nacl   # the papers' schedule (GPU)
    calibseg-train --gpu --data data/full --fold 0          # nnU-Net 2D's budget of crops on one GPU, ≤ 30 min
    calibseg-train --plan-only --data data/own --out runs/own   # only the plan: runs/own/plan.json

A run plans first (:mod:`Training.plan`: the training cases' fingerprint, the grid, patch, normalisation,
classes and channels; each flag overrides its part), writes the plan to the run folder's ``plan.json``, builds
its configuration from plan, schedule and flags once (:func:`Training.config.train_config`), then trains on
random crops at the plan's spacing, a third of them centred on foreground, with rotation, scaling, mirroring
and intensity augmentation, and segments whole slices by sliding window. The default *quick* schedule and
``--cpu`` use MONAI's UNet (16–256 channels, 2 residual units, instance norm) on 128×128 crops with Adam 1e-3
and poly decay, ``torch.compile``d; ``--paper`` is the papers' 100 epochs of one pass each with Adam 1e-3 →
1e-4 at epoch 50, on 224×224 crops (:mod:`Training.schedules`). Any flag overrides its schedule's value.

Several GPUs (or CPU processes) train one run data-parallel under torchrun
(:mod:`Training.distributed`): ``torchrun --standalone --nproc_per_node N -m Training.train ...``;
each process trains on ``--batch-size / N`` crops of every batch, the first one writes the files.

Writes into ``--out`` (default: ``runs/<method>`` under the current folder, or the next free
``runs/<method>-N``), and prints these paths when it starts: ``plan.json`` (before the first step),
``checkpoint.pt`` (every epoch, atomic), ``history.jsonl``, ``tensorboard/``,
``model.calibseg`` (the best validation-Dice weights with the mirroring, temperature and
post-processing chosen on validation), ``run.json`` (wall time, steps, the choices) and
``evaluation/`` (3D test metrics, see calibseg-evaluate). The bundle records the data by
dataset name (``acdc-sample``, ``acdc`` or the folder's name), the split file by its name when
it is a shipped one, and the patient lists, never a path of this machine
(:func:`Datasets.dataset_names.data_folder` finds the data again).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path
from typing import Any, Sequence

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.device import resolve_device
from CalibSegLib.io import check_output_folder, os_error_sentence, write_json_atomic
from Datasets.dataset_defaults import volumes_note
from Datasets.dataset_json import read_dataset_description
from Datasets.dataset_names import dataset_name
from Datasets.errors import DataError
from Datasets.layouts import CaseFile, ignored_images
from Datasets.loading import Case
from Datasets.splits import SIDES, split_reference
from Evaluation.evaluate import evaluate_bundle, print_summary
from Evaluation.quality_report import DEGRADATIONS
from Evaluation.summary import EVALUATION_DIR
from Training.checkpoint import CheckpointError
from Training.command_line import ALL_FOLDS, parser
from Training.config import TrainConfig, check_config, check_flags, train_config
from Training.cross_validation import run_cross_validation
from Training.distributed import Processes, start_processes, stop_processes
from Training.out_of_fold import evaluate_out_of_fold, out_of_fold_dir
from Training.plan import channel_names, check_stored_plan, class_count, make_plan, spacing_text, write_plan
from Training.records import BUNDLE_NAME, CHECKPOINT_NAME, HISTORY_NAME, PLAN_NAME, RUN_SUMMARY_NAME
from Training.run_folder import interrupted_text, missing_folders, remove_new_entries, run_folder
from Training.run_lock import run_folder_lock
from Training.schedules import chosen_schedule
from Training.split_choice import load_split_cases
from Training.trainer import Trainer

__all__ = ["main", "run"]


def run(arguments: argparse.Namespace) -> Path | None:
    """Plan, then train (or resume) and evaluate; returns the bundle path (None in torchrun's other processes,
    and with ``--plan-only``, which writes the run folder's ``plan.json`` and nothing else).

    Everything that can be wrong with the flags, the output folder and the data is checked before the run
    folder is created, so a refused run leaves nothing behind; a fresh run that fails or is interrupted
    (Ctrl-C) before its first checkpoint removes what it made, folders included.
    """
    check_flags(arguments)
    description = read_dataset_description(arguments.data)
    num_classes = class_count(arguments, description)
    schedule = chosen_schedule(arguments)
    run_dir = check_output_folder(run_folder(arguments))
    checkpoint = run_dir / CHECKPOINT_NAME
    if checkpoint.exists() and not arguments.resume:
        raise DataError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out.")
    if arguments.resume and not checkpoint.exists():
        raise CheckpointError(f"--resume was given but {checkpoint} does not exist.")
    files, choice, cases = load_split_cases(arguments, num_classes, run_dir, description)
    dataset = dataset_name(arguments.data, files)
    plan = make_plan(cases["train"], dataset, arguments, schedule.patch_size,
                     channel_names(files, description), description)
    processes = Processes.from_environment()
    # A stored plan (--plan-only's, or a resumed run's) must be this run's; only --plan-only replaces one, and
    # never the plan of a run that has trained.
    if processes.is_main and not (arguments.plan_only and not checkpoint.exists()):
        check_stored_plan(run_dir, plan)
    config = train_config(plan, schedule, arguments)
    check_config(config)
    # Names, not paths of this machine: readers find the data again with Datasets.dataset_names.data_folder.
    data_description = {"dataset": dataset, "split_file": split_reference(choice.file), **choice.split}
    if arguments.fold is not None:
        data_description["fold"] = arguments.fold
    start = _describe_start(run_dir, dataset, files, choice.file, choice.split, cases,
                            ignored_images(arguments.data), arguments.plan_only)
    print("\n".join([*plan.lines(), *start]), flush=True)
    made = missing_folders(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        # The main process holds the run folder; under torchrun the others train beside it, writing nothing.
        with run_folder_lock(run_dir) if processes.is_main else contextlib.nullcontext():
            before = set(os.listdir(run_dir))
            try:
                if processes.is_main:
                    write_plan(run_dir, plan)
                if arguments.plan_only:
                    return None
                if choice.new is not None and processes.is_main:  # the run can be repeated from it
                    write_json_atomic(choice.file, choice.new)
                    print(choice.announcement, flush=True)
                start_processes(processes, resolve_device(config.device))
                try:
                    return _train_and_evaluate(arguments, config, run_dir, cases, data_description, processes)
                finally:
                    stop_processes(processes)
            except BaseException:
                if processes.is_main and not arguments.resume and not checkpoint.exists():
                    # Nothing to resume from: the run leaves nothing, as a refused one does (the lock is held,
                    # so no other run is adding to the folder meanwhile).
                    if choice.new is not None:
                        choice.file.unlink(missing_ok=True)
                    remove_new_entries(run_dir, before)
                raise
    except BaseException as error:
        for folder in reversed(made):  # the folders it made: empty unless it trained (rmdir keeps the others)
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(error, KeyboardInterrupt):
            raise KeyboardInterrupt(interrupted_text(checkpoint, run_dir.exists())) from None
        raise


def _describe_start(run_dir: Path, dataset: str, files: Sequence[CaseFile], split_file: Path,
                    split: dict[str, list[str]], cases: dict[str, list[Case]], ignored: Sequence[Path] = (),
                    plan_only: bool = False) -> list[str]:
    """What the run reads (and the images ``dataset.json``'s ``file_ending`` leaves out, ``ignored``) and
    where it writes, printed before the first epoch."""
    counts = ", ".join(f"{len(split[side])} {label}"
                       for side, label in zip(SIDES, ("training", "validation", "test")))
    unused = len({file.patient_id for file in files} - {patient for side in SIDES for patient in split[side]})
    if unused:
        counts += f" ({unused} more patient(s) in the folder are in no side of the split and not used)"
    volumes = ", ".join(str(len(cases[side])) for side in SIDES)
    more = f" and {len(ignored) - 5} more" if len(ignored) > 5 else ""
    names = ", ".join(path.name for path in ignored[:5]) + more
    leftover = [f"data: ignored, as dataset.json's file_ending says: {names}"] if ignored else []
    writes = (f"{PLAN_NAME} only (--plan-only)" if plan_only else
              f"{PLAN_NAME} (the plan above), {CHECKPOINT_NAME} (every epoch; --resume continues it), "
              f"{HISTORY_NAME} (per-epoch losses and validation metrics), tensorboard/ (tensorboard "
              f"--logdir {run_dir / 'tensorboard'}), at the end {BUNDLE_NAME}, {RUN_SUMMARY_NAME} and "
              f"{EVALUATION_DIR}/")
    return [f"data: {dataset}, split {split_reference(split_file)}: {counts} patients = {volumes} volumes"
            f"{volumes_note(dataset)}", *leftover, f"run folder {run_dir}: {writes}"]


def _train_and_evaluate(arguments: argparse.Namespace, config: TrainConfig, run_dir: Path,
                        cases: dict[str, list[Case]], data_description: dict[str, Any], processes: Processes
                        ) -> Path | None:
    """Train (or resume) in this process, and in the main one evaluate; the bundle path (None elsewhere)."""
    checkpoint = run_dir / CHECKPOINT_NAME
    trainer = Trainer(config, cases["train"], cases["val"], run_dir, data_description, processes)
    if arguments.resume:
        trainer.resume(checkpoint)
        print(f"resumed {run_dir} after epoch {trainer.epoch}")
    loss_text = ", ".join(f"{key}={value}" for key, value in config.loss_args.items())
    method_text = f"{config.method} ({loss_text})" if loss_text else config.method
    items = "training slices" if config.spatial_dims == 2 else "training volumes"
    print(f"{method_text}: {len(trainer.sampler)} {items}, {len(cases['val'])} validation volumes, "
          f"{config.epochs} epochs of {trainer.steps_per_epoch} batches of {config.batch_size} "
          f"{'×'.join(map(str, config.patch_size))} crops at {spacing_text(config.target_spacing)} mm on "
          f"{trainer.device}"
          + (f", {processes.world_size} processes of {config.batch_size // processes.world_size} crops each"
             if processes.is_distributed else ""), flush=True)
    result = trainer.fit()
    if result is None:  # not the main process: it wrote nothing and evaluates nothing
        return None
    print(f"best validation Dice {result.best_validation_dice:.3f} at epoch {result.best_epoch}")
    print(f"bundle: {result.bundle_path}")
    if arguments.fold is not None:
        out_of_fold = evaluate_out_of_fold(load_bundle(result.bundle_path), cases["val"], run_dir, config.device,
                                           config.batch_size)
        print_summary(out_of_fold.summary, out_of_fold_dir(run_dir), f"out of fold {arguments.fold}")
    if not arguments.no_eval and cases["test"]:
        evaluation_dir = run_dir / EVALUATION_DIR
        evaluation = evaluate_bundle(load_bundle(result.bundle_path), cases["test"], evaluation_dir,
                                     device=config.device, batch_size=config.batch_size,
                                     degradations=tuple(DEGRADATIONS) if arguments.degraded else ())
        print_summary(evaluation.summary, evaluation_dir)
    return result.bundle_path


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibseg-train`` command: prints the bundle's path; returns the exit status 0. Bad input
    exits with one sentence, no traceback. Under torchrun every process runs it, and only the first speaks."""
    arguments = parser().parse_args(argv)
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as outputs:
            if not Processes.from_environment().is_main:  # under torchrun the main process speaks for the run
                outputs.enter_context(contextlib.redirect_stdout(outputs.enter_context(open(os.devnull, "w"))))
            run_cross_validation(arguments, run) if arguments.fold == ALL_FOLDS else run(arguments)
            print(f"total time {time.perf_counter() - started:.0f} s")
    except (DataError, CheckpointError, BundleError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    except KeyError as error:  # unknown loss hyper-parameter: the registry's sentence is its argument
        raise SystemExit(f"error: {error.args[0]}") from None
    except KeyboardInterrupt as interruption:  # run() says what was kept once the run folder exists
        raise SystemExit(str(interruption) or "interrupted before training started: nothing was written.") from None
    return 0


if __name__ == "__main__":
    main()
