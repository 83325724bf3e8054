"""Store in a bundle what its training inputs looked like, to the statistics and to its network, and its
classes' standard terminology.

    python -m Training.fit_input_check --bundle runs/ce_dice/model.calibseg [--data DIR] [--out PATH]
    python -m Training.fit_input_check --bundle acdc_crac --data /path/to/acdc
        --out CalibSegLib/pretrained/acdc_crac.calibseg

The training and validation patients the bundle records (``bundle.json``: ``data["train"]``,
``data["val"]``) are read from ``--data`` or the folder of the dataset the bundle records.
:func:`CalibSegLib.input_check.statistics_of_cases` computes ``input_statistics`` from the training images
and reference labels with the decided :data:`CalibSegLib.input_check.THRESHOLDS`, and
:func:`CalibSegLib.features.fit_network_features` the network's feature statistics: their Gaussian from
the training volumes, the distance threshold from the validation volumes at a 5 % false-alarm rate (the
network's encoder runs once over every volume; no segmentation is run). A bundle without ``class_terminology``
gets its classes' codes where Datasets knows them (:func:`Datasets.dataset_defaults.default_terminology`). An
ensemble's four families come from its first member's training patients
(:func:`Training.ensemble.judging_patients`), its features from every member
(:func:`CalibSegLib.features.fit_member_features`: each member's Gaussian from the patients it trained on, one
threshold pooled over the folds they never saw, the majority deciding). The bundle is rewritten atomically
(default: in place; a shipped model: ``runs/<name>/<name>.calibseg``) with the same weights in
the same dtype, so its checksum and predictions stay as they were.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import load_bundle
from CalibSegLib.device import resolve_device
from CalibSegLib.features import fit_member_features, fit_network_features
from CalibSegLib.input_check import statistics_of_cases
from CalibSegLib.pretrained import resolve_bundle_path
from Datasets.dataset_defaults import default_terminology
from Training.bundle_rewrite import add_data_arguments, recorded_cases, rewrite_bundle, rewrite_destination
from Training.ensemble import judging_patients, member_cases

__all__ = ["refit_input_check", "main"]


def refit_input_check(bundle: str | Path, data: str | Path | None = None, out: str | Path | None = None,
                      device: str = "auto", batch_size: int = 16) -> Path:
    """Write ``bundle`` with ``input_statistics`` from its training patients, the network's feature
    statistics from its training and validation patients (and its classes' codes); its path.

    Raises:
        BundleError, DataError, InputStatisticsError, FeatureStatisticsError: unreadable bundle, missing data,
            training or validation patients, or too few of them (one sentence each).
    """
    path = resolve_bundle_path(bundle)
    out = rewrite_destination(path, out)
    loaded = load_bundle(path)
    metadata = loaded.metadata
    network = loaded.build_model().to(resolve_device(device))
    if metadata.ensemble_size > 1:
        labelled = recorded_cases(metadata, path.name, data, "train", "compute its input statistics")
        first_trained, _ = judging_patients(metadata)
        training = [case for case in labelled if case.patient_id in first_trained]
        features = fit_member_features(list(network.members), metadata, *member_cases(metadata, labelled),
                                       batch_size)
    else:
        training = recorded_cases(metadata, path.name, data, "train", "compute its input statistics")
        validation = recorded_cases(metadata, path.name, data, "val", "choose its feature distance threshold")
        features = fit_network_features(network, metadata, training, validation, batch_size)
    terminology = metadata.class_terminology or default_terminology(metadata.class_names)
    refitted = dataclasses.replace(metadata, input_statistics=statistics_of_cases(metadata, training,
                                                                                   features=features),
                                   class_terminology=terminology)
    return rewrite_bundle(loaded, refitted, out)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the written bundle's path; returns 0. Bad input exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="python -m Training.fit_input_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the bundle here (default: in place; a shipped model: runs/<name>/<name>.calibseg)")
    add_data_arguments(parser)
    arguments = parser.parse_args(argv)
    try:
        written = refit_input_check(arguments.bundle, arguments.data, arguments.out, arguments.device,
                                    arguments.batch_size)
        print(f"bundle: {written}")
    except ValueError as error:  # BundleError, DataError, InputStatisticsError, FeatureStatisticsError
        raise SystemExit(f"error: {error}") from None
    except KeyboardInterrupt:  # the bundle is rewritten atomically, at the very end
        raise SystemExit(f"interrupted: {arguments.out or arguments.bundle} was not written.") from None
    return 0


if __name__ == "__main__":
    main()
