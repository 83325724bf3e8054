"""CalibSegLib: the pure-Python core of CalibSeg (losses, metrics, networks, inference, bundles, IO).

It never imports Slicer, Qt or VTK, so the training scripts, the command line and the
Slicer module all use the same code.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
