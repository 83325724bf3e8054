#!/usr/bin/env bash
# Creates .venv with everything CalibSeg needs for training, evaluation and the tests.
# torch is pinned to the CPU wheel: an unpinned "torch" pulls a multi-GB CUDA build.
# On a GPU machine install the CUDA build of torch into .venv first; this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n[setup %s] %s\n' "$1" "$2"; }
step 1/3 "virtual environment .venv (upgrading pip)"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
if .venv/bin/python -c "import torch" 2>/dev/null; then
    step 2/3 "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)') already installed: kept"
else
    step 2/3 "torch 2.13.0, CPU build (about 200 MB; a minute or two)"
    .venv/bin/python -m pip install "torch==2.13.0"
fi
step 3/3 "CalibSeg with its training and test dependencies (MONAI, SimpleITK, h5py, slicer-core, ...)"
.venv/bin/python -m pip install -e ".[dev]"
.venv/bin/python -c "import CalibSegLib, torch, monai; print(f'[setup done] CalibSeg {CalibSegLib.__version__}, torch {torch.__version__}, MONAI {monai.__version__}')"
echo "[setup done] commands: $(cd .venv/bin && echo calibseg-*)"
