"""CalibSegLib: the pure-Python core of CalibSeg (losses, metrics, networks, inference, bundles, IO).

It never imports Slicer, Qt or VTK, so the training scripts, the command line and the
Slicer module all use the same code.
"""

__version__ = "0.1.0"
# The model bundle's file suffix (CalibSegLib.bundle). Defined here, where importing costs nothing, because
# CalibSegLib.pretrained and the Slicer module need it before torch, which the bundle code imports, is installed.
BUNDLE_SUFFIX = ".calibseg"

__all__ = ["__version__", "BUNDLE_SUFFIX"]
