"""Test Dice per structure of an interrupted run's last checkpoint (no bundle yet), with the preprocessing and sliding
window of a finished run's bundle on the same data, split and seed (hence the same plan); T = 1, no post-processing.

    PYTHONPATH=. python scripts/checkpoint_test_dice.py RUN REFERENCE_BUNDLE DATA
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from CalibSegLib.bundle import Bundle, load_bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.metrics import dice
from CalibSegLib.postprocessing import Postprocessing
from Datasets.cases import find_cases, load_cases
from Datasets.splits import select_patients

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    """Print the checkpoint's epoch and its mean test Dice per structure; 2 when the runs' test sides differ."""
    run, reference_bundle, data = argv
    metadata = load_bundle(reference_bundle).metadata
    if json.loads(open(f"{run}/split.json").read())["test"] != metadata.data["test"]:
        print(f"error: {run} and {reference_bundle} hold out different test patients.", file=sys.stderr)
        return 2
    state = torch.load(f"{run}/checkpoint.pt", map_location="cpu", weights_only=False)
    metadata = replace(metadata, postprocessing=Postprocessing(), temperature=1.0, quality_model=None)
    predictor = Predictor(Bundle(metadata, state["model"]), device="cpu")
    cases = load_cases(select_patients(find_cases(data), metadata.data["test"]), metadata.num_classes)
    scores = np.array([dice(predictor.predict(case.image, case.spacing).labels, case.label, metadata.num_classes)
                       for case in cases])
    means = ", ".join(f"{name} {value:.3f}" for name, value in zip(metadata.class_names[1:], np.nanmean(scores, 0)))
    print(f"checkpoint after epoch {state['epoch']}: {len(cases)} test cases; {means}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
