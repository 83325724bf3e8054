"""Training: the command line (``train.py``), the loop (``trainer.py``: validation, the loss's epoch hook,
the choices made on validation, the bundle and ``run.json``), crops and batches (``batches.py``),
checkpoints (``checkpoint.py``), refitting a bundle's quality model (``fit_quality.py``) and comparing
ways of fitting it on validation (``quality_choice.py``).

Depends on CalibSegLib, Datasets and Evaluation (a finished run is evaluated on its test patients).
"""
