"""Write the README's picture of the QC report page (rerun after changing the models or the page).

    .venv/bin/python -m scripts.make_report_picture [--model acdc_ce_dice] [--keep FOLDER]

(from the repository root; it writes the series with :func:`Datasets.dicom_series.write_series` and renders the
page with :func:`Reporting.chromium.screenshot`, which needs Debian's ``chromium``).

The six volumes of the shipped sample's patients that are test patients of ``Datasets/splits/acdc.json``
(patient041, 068 and 069, end-diastole and end-systole; the shipped models never saw them) are written as
DICOM series, one folder each, at 12 bits with ACDC's assumed spacing; ``calibseg-predict --image-dir ...
--dicom-seg --report`` segments them with ``--model``, and headless Chromium renders the page's top (the
legend, the cases worst first and the worst case) in a 1000 × 1080 window, written scaled to 800 pixels wide
to ``docs/images/report.png``. ``--keep`` keeps the series and outputs in FOLDER (else a temporary folder).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from CalibSegLib.io import ImageGeometry
from CalibSegLib.predict import main as predict
from CalibSegLib.pretrained import DEFAULT_MODEL
from Datasets.dataset_names import SAMPLE_DATA
from Datasets.dicom_series import write_series
from Datasets.layouts import find_cases
from Datasets.loading import load_cases
from Datasets.splits import SPLITS_DIR, load_split, select_patients
from Reporting.chromium import screenshot

REPO_ROOT = Path(__file__).resolve().parents[1]
PICTURE = REPO_ROOT / "docs" / "images" / "report.png"
PICTURE_WIDTH = 800


def write_sample_series(folder: Path) -> list[str]:
    """The sample's test-patient volumes as DICOM series under ``folder``, one subfolder per volume."""
    patients = sorted({file.patient_id for file in find_cases(SAMPLE_DATA)} & set(load_split(
        SPLITS_DIR / "acdc.json")["test"]))
    for case in load_cases(select_patients(find_cases(SAMPLE_DATA), patients), 4):
        write_series(folder / case.case_id, np.rint(case.image * 4095), ImageGeometry(case.spacing),
                     description=case.case_id)
    return patients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="shipped model name or bundle path")
    parser.add_argument("--keep", type=Path, help="keep the series and outputs in this folder")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = arguments.keep or Path(temporary)
        patients = write_sample_series(folder / "series")
        print(f"series of {', '.join(patients)} in {folder / 'series'}")
        status = predict(["--bundle", arguments.model, "--image-dir", str(folder / "series"), "--out-dir",
                          str(folder / "out"), "--dicom-seg", "--report", "--device", "cpu"])
        if status != 0:
            raise SystemExit(status)
        page = screenshot(folder / "out" / "report.html", folder / "page.png", width=1000, height=1080)
        with Image.open(page) as picture:
            height = round(picture.height * PICTURE_WIDTH / picture.width)
            picture.convert("RGB").resize((PICTURE_WIDTH, height), Image.LANCZOS).save(PICTURE, optimize=True)
    print(f"{PICTURE.relative_to(REPO_ROOT)}  {PICTURE.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
