"""Shared pytest configuration: paths to shipped data and a small, deterministic torch setup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_ACDC = REPO_ROOT / "SampleData" / "ACDC"

# CI has 2 cores and pytest-xdist may run two workers: one thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def sample_acdc_dir() -> Path:
    return SAMPLE_ACDC


@pytest.fixture(scope="module")
def sample_cases(sample_acdc_dir):
    """The sample split's first training and first validation patient, loaded (test_training, test_distributed;
    test_pretrained has its own ``sample_cases``, which overrides this one there)."""
    from Datasets.layouts import find_cases
    from Datasets.loading import load_cases
    from Datasets.splits import SPLITS_DIR, load_split

    files = find_cases(sample_acdc_dir)
    split = load_split(SPLITS_DIR / "acdc_sample.json")
    pick = lambda patients: load_cases([f for f in files if f.patient_id in patients], 4)  # noqa: E731
    return pick(split["train"][:1]), pick(split["val"][:1])
