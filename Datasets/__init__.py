"""Data: where the volumes are and how they are read (``layouts.py``: ACDC HDF5 files, image/label pairs,
Decathlon folders; ``loading.py``; ``model_grid.py``; ``dataset_names.py``: dataset names and finding them again),
the fixed patient-level splits (``splits/``) and the converter of the official ACDC release (``convert_acdc.py``).

Depends on CalibSegLib only; every later stage (Evaluation, Training, Reporting) reads data through it.
"""
