"""Reporting: what is made from finished runs — the papers' comparison table (``benchmark.py``, which
also trains the methods alike), the results page (``results.py``), the shipped models and their recorded
metrics (``ship.py``), README's generated tables (``readme_tables.py``), the quality tables
(``quality_tables.py``) and their shared number formatting (``formatting.py``).

The top stage: reads the typed run and evaluation summaries (``Training.trainer.RunSummary``,
``Evaluation.summary.EvaluationSummary``); nothing imports it.
"""
