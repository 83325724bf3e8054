"""Cardiac function from a cardiac bundle's segmentation: volumes, ejection fractions and myocardial mass, each with
a 90 % interval whose coverage was measured.

- :mod:`.indices`: the structures (by SNOMED CT code) and their volumes in mL in one phase;
- :mod:`.phases`: which phases of a cine are ED and ES;
- :mod:`.intervals`: the indices of an ED/ES pair, their per-case scale and the split-conformal interval rule, fitted
  and applied (the rule as a bundle stores it: :mod:`CalibSegLib.interval_rule`);
- :mod:`.members`: an ensemble's members as predictors of their own (what the rule is fitted and checked on);
- :mod:`.function`: :func:`~.function.measure_function` and :func:`~.function.measure_cine`, the result and its
  ``function.json``;
- :mod:`.command`: ``calibseg-function``.

Nothing is imported here: a reader of one module (:mod:`.indices`, say) loads no bundle or predictor, which the
measuring modules read.
"""
