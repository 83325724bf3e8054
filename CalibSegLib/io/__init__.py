"""Files in and out: images with their geometry, atomic output sets, and channel-file names.

Three parts, each a module: ``images.py`` reads and writes ``(z, y, x)`` arrays with their
:class:`ImageGeometry` through SimpleITK (``image_checks.py``: what a file's header claims, checked against
its data, since ITK's readers hide NaN voxels and short files); ``outputs.py`` writes any file, or a set of
files (:class:`OutputSet`), atomically and all-or-nothing; ``channel_files.py`` names the files of a case's
channels (``<case>_0000`` ...). Every name below is importable from ``CalibSegLib.io``.
"""

from CalibSegLib.io.channel_files import case_and_channel, group_channels
from CalibSegLib.io.images import (IMAGE_SUFFIXES, WRITE_SUFFIXES, ImageDimensionError, ImageGeometry, image_from_array,
                                   image_stem, read_channels, read_image, write_image)
from CalibSegLib.io.outputs import (OutputSet, atomic_output, check_output_file, check_output_folder,
                                    os_error_sentence, recorded_path, write_json_atomic)

__all__ = [
    "IMAGE_SUFFIXES",
    "WRITE_SUFFIXES",
    "ImageGeometry",
    "ImageDimensionError",
    "read_image",
    "case_and_channel",
    "group_channels",
    "read_channels",
    "write_image",
    "image_from_array",
    "image_stem",
    "check_output_folder",
    "check_output_file",
    "OutputSet",
    "atomic_output",
    "write_json_atomic",
    "recorded_path",
    "os_error_sentence",
]
