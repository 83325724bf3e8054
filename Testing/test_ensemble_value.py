"""studies/ensemble_value.py: its helpers on tiny synthetic arrays, each against an independent computation (a
sub-ensemble's average and disagreement, the binned error scores and the AUROC read from them), and its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from CalibSegLib.metrics import error_detection_auroc
from studies.ensemble_value import SCORE_EDGES, histogram_auroc, main, score_histogram, subset_maps, subsets


def _member_probabilities(members: int, shape: tuple[int, ...], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=(members, *shape))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return [member.astype(np.float32) for member in probabilities]


def test_every_three_of_five_members_once():
    chosen = subsets(5, 3)
    assert len(chosen) == math.comb(5, 3) == len(set(chosen))
    assert all(len(set(subset)) == 3 and set(subset) <= set(range(5)) for subset in chosen)


def test_a_subsets_average_and_disagreement_are_the_mean_and_its_mutual_information():
    members = _member_probabilities(5, (4, 2, 3, 3), seed=0)
    subset = (0, 2, 3)
    average, disagreement = subset_maps(members, subset)
    chosen = np.stack([members[index].astype(np.float64) for index in subset])
    expected_average = chosen.mean(axis=0)

    def entropy(probabilities: np.ndarray) -> np.ndarray:  # over the class axis, normalised by log C
        return -(probabilities * np.log(probabilities)).sum(axis=-4) / np.log(4)

    expected_disagreement = np.clip(entropy(expected_average) - entropy(chosen).mean(axis=0), 0.0, 1.0)
    assert average == pytest.approx(expected_average, abs=1e-6)
    assert disagreement == pytest.approx(expected_disagreement, abs=1e-5)
    assert disagreement.max() > 0.01  # the members differ, so the check above compares something


def test_one_member_is_its_own_average_without_disagreement():
    members = _member_probabilities(3, (4, 2, 3, 3), seed=1)
    average, disagreement = subset_maps(members, (1,))
    assert disagreement is None
    np.testing.assert_array_equal(average, members[1])


def test_the_histogram_counts_wrong_and_right_voxels_per_bin():
    score = np.array([0.0, 5e-9, 1e-3, 1e-3, 0.5, 1.0])
    wrong = np.array([False, True, True, False, True, False])
    histogram = score_histogram(score, wrong)
    assert histogram.shape == (2, len(SCORE_EDGES) - 1)
    assert histogram[0].sum() == 3 and histogram[1].sum() == 3
    # 0 and 5e-9 share the first bin [0, 1e-8); 1.0 falls in the last, closed bin.
    assert histogram[:, 0].tolist() == [1, 1]
    assert histogram[:, -1].tolist() == [0, 1]


def test_the_histogram_auroc_is_the_rank_auroc_of_the_binned_scores():
    rng = np.random.default_rng(2)
    wrong = rng.random(4000) < 0.2
    # wrong voxels tend to score higher, on the log scale the bins use; many ties inside bins
    score = 10.0 ** np.where(wrong, rng.uniform(-6, 0, wrong.size), rng.uniform(-8, -1, wrong.size))
    binned = np.searchsorted(SCORE_EDGES, score, side="right")
    expected = error_detection_auroc(-binned, ~wrong)  # rank-based, ties one half
    assert histogram_auroc(score_histogram(score, wrong)) == pytest.approx(expected, abs=1e-12)
    assert 0.6 < expected < 0.99


def test_scores_in_separate_bins_give_the_exact_auroc():
    score = np.array([1e-7, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1])
    wrong = np.array([False, True, False, True, False, True])
    assert histogram_auroc(score_histogram(score, wrong)) == pytest.approx(error_detection_auroc(1 - score, ~wrong))
    assert math.isnan(histogram_auroc(score_histogram(score, np.zeros(6, bool))))


@pytest.mark.parametrize("arguments, sentence", [
    (["pass", "acdc_ce_dice"], "The pass needs --out, the folder of its per-volume records."),
    (["report", "acdc_ce_dice", "--record", "x.json"],
     "The report needs --records (the pass's folder) and --record (the JSON to write)."),
])
def test_a_missing_folder_is_refused_in_one_sentence(arguments, sentence):
    with pytest.raises(SystemExit) as refusal:
        main(arguments)
    assert str(refusal.value) == f"error: {sentence}"


def test_a_report_without_records_is_refused_before_writing(tmp_path):
    record = tmp_path / "value.json"
    with pytest.raises(SystemExit) as refusal:
        main(["report", "acdc_ce_dice", "--records", str(tmp_path / "empty"), "--record", str(record)])
    assert str(refusal.value).startswith("error: No per-volume records under ")
    assert not record.exists()
