"""A page rendered by headless Chromium (Debian's ``chromium`` package), as a reader's browser shows it: the
README's picture of the report page (``scripts/make_report_picture.py``) and the report page's tests.

    from Reporting.chromium import CHROMIUM, screenshot
    screenshot(out / "report.html", out / "report.png", width=1000, height=1400)

Chromium runs with a throw-away profile, no network services (no component updates, sync or background
requests) and no GPU; the page is loaded from its file. ``CHROMIUM`` is None where the browser is absent
(tests skip then; ``.ci/run`` installs it).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["CHROMIUM", "screenshot"]

CHROMIUM = shutil.which("chromium")


def screenshot(page: Path, picture: Path, width: int = 1000, height: int = 1400,
               timeout: float = 120.0) -> Path:
    """Render the HTML file ``page`` in a ``width`` × ``height`` window and write the PNG ``picture``."""
    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium).")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
                        f"--window-size={width},{height}", f"--screenshot={picture}",
                        Path(page).resolve().as_uri()],
                       check=True, capture_output=True, timeout=timeout)
    return picture
