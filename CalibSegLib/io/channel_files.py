"""Channel-file names: nnU-Net's and the Medical Segmentation Decathlon's ``<case>_<four-digit channel>``.

A case of K channels is K image files ``<case>_0000`` ... ``<case>_000K`` (one per channel); a file
without the suffix is a case of one channel. Datasets (:mod:`Datasets.layouts`), ``calibseg-predict
--image-dir`` and the Slicer batch group their inputs by these names.
"""

from __future__ import annotations

import re

__all__ = ["case_and_channel", "group_channels"]

# nnU-Net / Medical Segmentation Decathlon image files: <case>_<four-digit channel index>.<ext>
_CHANNEL_FILE = re.compile(r"^(.+)_(\d{4})$")


def case_and_channel(stem: str) -> tuple[str, int | None]:
    """The case and channel of an image file's stem: ``("brain", 1)`` for ``brain_0001``, ``(stem, None)``
    without a four-digit channel suffix."""
    match = _CHANNEL_FILE.match(stem)
    return (match.group(1), int(match.group(2))) if match else (stem, None)


def group_channels(stems: "list[str] | tuple[str, ...]") -> list[tuple[str, dict[int, int]]]:
    """The cases of images named by their stems, in the order each case first appears: its name and
    ``{channel: position in stems}``. The ``<case>_0000`` ... ``_000K`` images of a case are one case; an
    image without a channel suffix is a case of its own, ``{0: position}``, even beside a ``<stem>_0000``
    image."""
    cases: dict[tuple[str, bool], dict[int, int]] = {}
    for position, stem in enumerate(stems):
        case, channel = case_and_channel(stem)
        cases.setdefault((case, channel is None), {})[channel or 0] = position
    return [(case, channels) for (case, _), channels in cases.items()]
