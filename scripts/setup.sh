#!/usr/bin/env bash
# Creates .venv with everything CalibSeg needs for training, evaluation and the tests.
# torch is pinned to the CPU wheel: an unpinned "torch" pulls a multi-GB CUDA build.
# On a GPU machine install the CUDA build of torch into .venv first; this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
