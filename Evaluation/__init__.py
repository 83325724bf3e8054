"""Evaluation: a bundle on test volumes in 3D (``evaluate.py``: per-case metrics, pooled calibration,
reliability diagrams), the quality model checked against measured Dice on clean and degraded volumes
(``quality_report.py``), and the typed ``summary.json`` both write and the reports read (``summary.py``).

Depends on CalibSegLib and Datasets; Training evaluates its bundle through it, Reporting reads its summaries.
"""
