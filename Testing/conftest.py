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
