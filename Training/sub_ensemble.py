"""A smaller ensemble from a larger one: some of its members, everything else as it was chosen.

    python -m Training.sub_ensemble acdc_ce_dice --members 0 1 2 --data data/full \\
        --out runs/acdc_ce_dice/acdc_ce_dice.calibseg
    calibseg-evaluate --bundle runs/acdc_ce_dice/acdc_ce_dice.calibseg --data data/full --degraded

An ensemble's choices were made on its fold networks' out-of-fold predictions, each volume predicted by one network
alone (:mod:`Training.ensemble`), so they hold for any subset of the members and are kept: the temperature,
mirroring, post-processing, the quality model (fitted on each fold network alone, applied to each member) and its
review thresholds, the cardiac function intervals. The kept members' weights are byte-identical, renumbered in the
order given. What depends on which members there are is fitted again: the input check
(:func:`Training.fit_input_check.refit_input_check`: the four families from the first kept member's training
patients, each kept member's feature Gaussian as before, the distance threshold pooled over the kept members'
out-of-fold volumes only, their majority deciding). The test metrics are cleared: ``calibseg-evaluate`` measures
the new file, or ``calibseg-ship --rerecord <name> --bundle <file>`` ships it in place of the shipped ensemble it came
from and records its metrics. The ensemble section's ``selected_from`` records the bundle, its weights and the
members kept (:meth:`CalibSegLib.bundle.Ensemble.kept`).

Written atomically (a temporary folder beside ``--out``, then the input check's rewrite to ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Sequence

from CalibSegLib.bundle import BundleError, load_bundle
from CalibSegLib.io import check_output_file, os_error_sentence
from CalibSegLib.pretrained import resolve_bundle_path
from Training.bundle_rewrite import add_data_arguments, rewrite_bundle
from Training.ensemble import MEMBER_PREFIX
from Training.fit_input_check import refit_input_check

__all__ = ["member_state", "sub_ensemble", "main"]


def member_state(state: dict, members: Sequence[int]) -> dict:
    """The weights of ``members`` of an ensemble's ``state`` (``members.<m>.<name>``), renumbered 0, 1, ... in the
    order given."""
    kept = {}
    for new, old in enumerate(members):
        prefix = f"{MEMBER_PREFIX}.{old}."
        kept.update({f"{MEMBER_PREFIX}.{new}.{name[len(prefix):]}": tensor
                     for name, tensor in state.items() if name.startswith(prefix)})
    return kept


def sub_ensemble(bundle: str | Path, members: Sequence[int], out: str | Path, data: str | Path | None = None,
                 device: str = "auto", batch_size: int = 16) -> Path:
    """Write the ensemble of ``members`` (indices into ``bundle``'s members, at least two, none twice) of
    ``bundle`` to ``out`` (module docstring); its path.

    Raises:
        BundleError: ``bundle`` is unreadable or no ensemble of three or more networks with its ``ensemble`` section.
        DataError, InputStatisticsError, FeatureStatisticsError: its patients cannot be read or fitted on.
        ValueError: ``members`` do not name at least two distinct ones of it, or ``out`` cannot be written (all one
            sentence).
    """
    path = resolve_bundle_path(bundle)
    out = check_output_file(out)
    loaded = load_bundle(path)
    metadata = loaded.metadata
    size = metadata.ensemble_size
    if size < 3:
        raise BundleError(f"{path.name} holds {size} network(s); a smaller ensemble needs one of three or more.")
    if metadata.ensemble is None:  # the kept members' folds and out-of-fold patients come from it
        raise BundleError(f"{path.name} holds {size} networks but no ensemble section saying where they came from; "
                          "build the ensemble with calibseg-ensemble.")
    if len(members) < 2 or len(set(members)) != len(members) or not all(0 <= index < size for index in members):
        raise ValueError(f"--members must name at least two distinct members of {path.name}, numbered 0 to "
                         f"{size - 1}; got {' '.join(map(str, members))}.")
    smaller = dataclasses.replace(metadata, ensemble_size=len(members),
                                  ensemble=metadata.ensemble.kept(members, path.name, metadata.weights_sha256),
                                  input_statistics=None, test_metrics={})
    # Staged under the ensemble's own name: the refit's refusals name the bundle whose patients it reads.
    with tempfile.TemporaryDirectory(prefix=f".{out.stem}-", dir=out.parent) as staging:
        staged = rewrite_bundle(loaded, smaller, Path(staging) / path.name,
                                state=member_state(loaded.state_dict, members))
        return refit_input_check(staged, data, out, device, batch_size)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the written bundle's path; returns 0. Bad input exits with one sentence, no traceback."""
    parser = argparse.ArgumentParser(prog="python -m Training.sub_ensemble", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="an ensemble bundle (.calibseg) or a shipped model's name")
    parser.add_argument("--members", type=int, nargs="+", required=True, help="the members to keep, e.g. 0 1 2")
    parser.add_argument("--out", type=Path, required=True, help="the smaller ensemble's bundle")
    add_data_arguments(parser)
    arguments = parser.parse_args(argv)
    try:
        written = sub_ensemble(arguments.bundle, arguments.members, arguments.out, arguments.data, arguments.device,
                               arguments.batch_size)
    except ValueError as error:  # BundleError, DataError, InputStatisticsError, FeatureStatisticsError
        raise SystemExit(f"error: {error}") from None
    except OSError as error:
        raise SystemExit(f"error: {os_error_sentence(error)}") from None
    except KeyboardInterrupt:  # staged beside --out, renamed onto it at the very end
        raise SystemExit("interrupted: no bundle was written.") from None
    print(f"{written}: members {' '.join(map(str, arguments.members))} of {arguments.bundle}; its input check "
          f"fitted again; measure it with calibseg-evaluate, or ship it with calibseg-ship --rerecord")
    return 0


if __name__ == "__main__":
    main()
