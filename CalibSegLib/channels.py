"""Which input is which channel of a bundle, and which inputs are one case: by identity, never by luck.

A multi-channel bundle (e.g. T1, T2, FLAIR) must read each channel from the input that holds it. Where the
inputs carry nnU-Net's channel suffixes (``a_0000.nii.gz`` ... ``a_0002.nii.gz``, or Slicer volumes named
``a_0000`` ...), the suffix says which channel an input is, whatever the order the user gave them in; without
suffixes the order given is the bundle's order (:func:`channel_order`). ``calibseg-predict`` (``--image``,
``--image-dir``) and the Slicer runner (a run, its channel selectors, a batch) all decide through it, and
refuse in one sentence, before any work: the same input twice (:func:`first_repeat`), suffixes of several
cases, suffixes that are not exactly ``_0000`` ... ``_000K`` for the K channels, and some inputs with a suffix
among others without. A batch refuses inputs that would be one case's same channel, or two cases of one name
(:func:`first_collision`), which would merge them or write one case's outputs over the other's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Sequence

from CalibSegLib.io import case_and_channel

if TYPE_CHECKING:
    from CalibSegLib.bundle import BundleMetadata

__all__ = ["input_names", "channel_order", "first_repeat", "first_collision"]


def input_names(metadata: "BundleMetadata") -> list[str]:
    """A bundle's input channels by name, channel 0 first: its ``channel_names``, else ``image`` for one
    channel and ``channel 0`` ... for several (a bundle that names none)."""
    if metadata.channel_names:
        return list(metadata.channel_names)
    count = metadata.in_channels
    return ["image"] if count == 1 else [f"channel {index}" for index in range(count)]


def first_repeat(keys: Sequence[Hashable]) -> tuple[int, int] | None:
    """The positions ``(earlier, later)`` of the first input given twice, by ``keys`` (a file's device and
    inode, a volume node's ID), or None when every input is different."""
    seen: dict[Hashable, int] = {}
    for position, key in enumerate(keys):
        if key in seen:
            return seen[key], position
        seen[key] = position
    return None


def first_collision(names: Sequence[str], grouped: bool = True) -> tuple[int, int] | None:
    """The positions of the first two inputs of a batch, by their ``names`` (file stems or volume names), that
    would be one case's same channel or two cases of one name, or None.

    ``grouped``: inputs are grouped into cases by their channel suffixes
    (:func:`CalibSegLib.io.group_channels`), so ``a_0001`` twice is one channel twice, and ``a`` beside
    ``a_0000`` two cases named ``a``; else every input is a case named as it is, and only a name given twice
    collides.
    """
    seen: dict[str, list[tuple[int | None, int]]] = {}  # case -> its inputs' (channel, position)
    for position, name in enumerate(names):
        case, channel = case_and_channel(name) if grouped else (name, None)
        for other, earlier in seen.get(case, []):
            if other == channel or other is None or channel is None:  # a bare name is a case of its own
                return earlier, position
        seen.setdefault(case, []).append((channel, position))
    return None


def channel_order(names: Sequence[str], channel_names: Sequence[str], kind: str = "file") -> list[int]:
    """The positions in ``names`` (file stems or volume names, as given) of the bundle's channels, channel 0
    first: by their channel suffixes when every name has one, else the order given.

    Args:
        names: one per input, in the order the user gave them.
        channel_names: the bundle's channels (``["image"]`` for one); with one channel nothing is reordered.
        kind: what an input is, for the sentences (``"file"``, ``"volume"``).

    Raises:
        ValueError: another number of inputs than channels, suffixes of several cases, suffixes other than
            ``_0000`` ... for the bundle's channels, or some names with a suffix and others without.
    """
    count = len(channel_names)
    if len(names) != count:
        raise ValueError(f"The model reads {count} channel(s) ({', '.join(channel_names)}), one {kind} each, "
                         f"but {len(names)} {kind}(s) were given.")
    if count == 1:
        return [0]
    parsed = [case_and_channel(name) for name in names]
    suffixed = [name for name, (_, channel) in zip(names, parsed) if channel is not None]
    if not suffixed:
        return list(range(count))

    def wanted(case: str = "<case>") -> str:
        return f"{case}_0000 to {case}_{count - 1:04d} ({', '.join(channel_names)})"

    if len(suffixed) != count:
        bare = next(name for name, (_, channel) in zip(names, parsed) if channel is None)
        raise ValueError(f"'{suffixed[0]}' carries a channel suffix but '{bare}' does not; name every {kind} "
                         f"{wanted()} or none of them (they are then read in the order given).")
    cases = list(dict.fromkeys(case for case, _ in parsed))
    if len(cases) > 1:
        raise ValueError(f"The {kind}s belong to different cases ({', '.join(cases)}) by their channel "
                         f"suffixes; give one case's {kind}s, {wanted()}.")
    channels = [channel for _, channel in parsed]
    if sorted(channels) != list(range(count)):
        found = ", ".join(f"_{channel:04d}" for channel in sorted(channels))
        raise ValueError(f"Case {cases[0]}'s {kind}s are the channels {found}, but the model reads "
                         f"{wanted(cases[0])}; give exactly those.")
    return [channels.index(channel) for channel in range(count)]
