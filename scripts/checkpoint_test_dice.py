"""Test Dice per structure of an interrupted run's last checkpoint (no bundle yet), with the preprocessing and sliding
window of a finished run's bundle on the same data, split and seed (hence the same plan).

    PYTHONPATH=. python scripts/checkpoint_test_dice.py RUN REFERENCE_BUNDLE DATA
"""
import json, sys
from dataclasses import replace
import numpy as np, torch
from CalibSegLib.bundle import load_bundle, Bundle
from CalibSegLib.inference import Predictor
from CalibSegLib.metrics import dice
from CalibSegLib.postprocessing import Postprocessing
from Datasets.cases import find_cases, load_cases
from Datasets.splits import select_patients
run, reference_bundle, data = sys.argv[1], sys.argv[2], sys.argv[3]
metadata = load_bundle(reference_bundle).metadata
assert json.load(open(f"{run}/split.json"))["test"] == metadata.data["test"]
state = torch.load(f"{run}/checkpoint.pt", map_location="cpu", weights_only=False)
print("checkpoint after epoch", state["epoch"])
metadata = replace(metadata, postprocessing=Postprocessing(), temperature=1.0, quality_model=None)
predictor = Predictor(Bundle(metadata, state["model"]), device="cpu")
files = find_cases(data)
cases = load_cases(select_patients(files, metadata.data["test"]), metadata.num_classes)
scores = np.array([dice(predictor.predict(case.image, case.spacing).labels, case.label, metadata.num_classes) for case in cases])
print(len(cases), "test cases;", dict(zip(metadata.class_names[1:], np.round(np.nanmean(scores, axis=0), 3))))
