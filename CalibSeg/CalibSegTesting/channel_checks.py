"""A multichannel bundle's inputs: one volume per channel on one grid, matched to the channels by their names'
suffixes and never taken twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from CalibSegRunner import SegmentationRunner, channel_choice_problem

from .scene import (NUM_CLASSES, SPACING_XYZ, class_segment_id, make_volume_node, phantom, scene_is_unchanged_after,
                    tiny_bundle)

__all__ = ["check_a_multichannel_bundle_reads_one_volume_per_channel",
           "check_channel_volumes_are_matched_by_name_and_never_taken_twice"]


def check_a_multichannel_bundle_reads_one_volume_per_channel(scene, work_dir: Path) -> None:
    import slicer

    from CalibSegLib.inference import Predictor

    first, _ = phantom()
    second, _ = phantom(seed=1)
    bundle_path = tiny_bundle(work_dir, in_channels=2, channel_names=["T1", "T2"])
    t1, t2 = make_volume_node(scene, first, "T1"), make_volume_node(scene, second[::-1].copy(), "T2")
    runner = SegmentationRunner()
    # Refused before anything is added: a channel missing, or one on another grid.
    missing = scene_is_unchanged_after(scene, lambda: runner.run(t1, bundle_path), "one volume for two channels")
    assert missing == ("The model reads 2 channel(s) (T1, T2), one volume each, but 1 volume(s) were "
                       "given."), missing
    shifted = make_volume_node(scene, second, "T2 shifted", origin=(0.0, 0.0, 0.0))
    elsewhere = scene_is_unchanged_after(scene, lambda: runner.run(t1, bundle_path, channelNodes=[shifted]),
                                          "off grid")
    assert elsewhere.startswith("The 'T2' volume 'T2 shifted' is not on the grid of 'T1';"), elsewhere
    outputs = runner.run(t1, bundle_path, channelNodes=[t2])
    expected = Predictor(bundle_path, device="cpu").predict(np.stack([first, second[::-1]]),
                                                            tuple(reversed(SPACING_XYZ))).labels
    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation,
                                                          class_segment_id(outputs.segmentation, label), t1)
        np.testing.assert_array_equal(mask > 0, expected == label)


def check_channel_volumes_are_matched_by_name_and_never_taken_twice(scene, work_dir: Path) -> None:
    """Volumes named ``<case>_0000`` ... are read as the channels their suffixes say, whatever the order they
    are given in, and the outputs are named after the case; one volume for two channels, suffixes of two cases
    or of a channel the model lacks are one sentence each, nothing added; one node for the one other channel
    is that channel (not Python's TypeError)."""
    import slicer

    from CalibSegLib.inference import Predictor

    arrays = [phantom(seed=seed)[0] for seed in range(3)]
    bundle_path = tiny_bundle(work_dir, in_channels=3, channel_names=["T1", "T2", "FLAIR"])
    t1, t2, flair = (make_volume_node(scene, array, f"a_000{index}") for index, array in enumerate(arrays))
    runner, logic_names = SegmentationRunner(), ["T1", "T2", "FLAIR"]
    for chosen, changed, problem in (
            ([t1, t2, flair], None, None), ([t1, None, flair], 1, None),
            ([flair, t2, flair], None, "The volume 'a_0002' is already chosen for the 'T1' channel; choose "
                                       "another volume for 'FLAIR'."),
            ([flair, t2, flair], 0, "The volume 'a_0002' is already chosen for the 'FLAIR' channel; choose "
                                    "another volume for 'T1'.")):  # the input selector was picked last
        assert channel_choice_problem(chosen, logic_names, changed) == problem
    twice = scene_is_unchanged_after(scene, lambda: runner.run(flair, bundle_path, channelNodes=[t2, flair]),
                                      "one volume for two channels")
    assert twice == ("The volume 'a_0002' is already chosen for the 'T1' channel; choose another volume for "
                     "'FLAIR'.")
    other = make_volume_node(scene, arrays[1], "b_0001")
    mixed = scene_is_unchanged_after(scene, lambda: runner.run(t1, bundle_path, channelNodes=[other, flair]),
                                      "two cases")
    assert mixed.startswith("The volumes belong to different cases (a, b) by their channel suffixes;"), mixed
    fourth = make_volume_node(scene, arrays[2], "a_0003")
    missing = scene_is_unchanged_after(scene, lambda: runner.run(t1, bundle_path, channelNodes=[t2, fourth]),
                                        "a channel the model lacks")
    assert missing.startswith("Case a's volumes are the channels _0000, _0001, _0003, but the model reads "
                              "a_0000 to a_0002 (T1, T2, FLAIR)"), missing
    outputs = runner.run(flair, bundle_path, channelNodes=[t1, t2])  # FLAIR as the input: still channel 2
    spacing = tuple(reversed(SPACING_XYZ))
    expected = Predictor(bundle_path, device="cpu").predict(np.stack(arrays), spacing).labels
    assert outputs.segmentation.GetName() == "a CalibSeg segmentation", outputs.segmentation.GetName()
    for label in range(1, NUM_CLASSES):
        mask = slicer.util.arrayFromSegmentBinaryLabelmap(outputs.segmentation,
                                                          class_segment_id(outputs.segmentation, label), flair)
        np.testing.assert_array_equal(mask > 0, expected == label)
    (work_dir / "two").mkdir()
    two_channels = tiny_bundle(work_dir / "two", in_channels=2, channel_names=["T1", "T2"])
    single = runner.prepare(t1, two_channels, channelNodes=t2)  # one node, not a list
    np.testing.assert_array_equal(single.image, np.stack(arrays[:2]))
