"""Method rankings as in the papers' tables: per-metric ranks, Friedman mean rank, sum of ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from scipy.stats import rankdata

__all__ = ["RankTable", "rank_methods"]


@dataclass
class RankTable:
    """``ranks (methods, columns)`` 1 = best; ``friedman`` mean rank and ``rank_sum`` per method; ``final`` rank."""

    methods: list[str]
    columns: list[str]
    ranks: np.ndarray
    friedman: np.ndarray
    rank_sum: np.ndarray
    final: np.ndarray


def rank_methods(
    table: Mapping[str, Mapping[str, float]], higher_is_better: Mapping[str, bool]
) -> RankTable:
    """Rank methods on every column (metric × dataset) of ``table[method][column]``.

    Tied methods share the best of their ranks (competition ranking, "1, 1, 3"): with it the
    CRaC paper's Table 1 Friedman ranks are reproduced exactly from its own numbers (average
    ranks miss four of them). A NaN value ranks last in its column. The Friedman rank of a
    method is its mean rank over columns; the final rank orders methods by it, ties shared
    the same way.

    Args:
        table: ``{method: {column: value}}``, every method with the same columns.
        higher_is_better: for each column, True when larger values are better (DSC), False
            otherwise (HD, ECE, ...).
    """
    methods = list(table)
    if not methods:
        raise ValueError("table is empty: give at least one method.")
    columns = list(table[methods[0]])
    for method in methods:
        if list(table[method]) != columns:
            raise ValueError(f"method {method!r} has columns {list(table[method])}, expected {columns}.")
    missing = [column for column in columns if column not in higher_is_better]
    if missing:
        raise ValueError(f"higher_is_better does not say the direction of {', '.join(missing)}.")
    ranks = np.empty((len(methods), len(columns)))
    for j, column in enumerate(columns):
        values = np.array([table[method][column] for method in methods], dtype=np.float64)
        badness = -values if higher_is_better[column] else values.copy()
        badness[np.isnan(badness)] = np.inf
        ranks[:, j] = rankdata(badness, method="min")
    friedman = ranks.mean(axis=1)
    return RankTable(
        methods=methods,
        columns=columns,
        ranks=ranks,
        friedman=friedman,
        rank_sum=ranks.sum(axis=1),
        final=rankdata(np.round(friedman, 10), method="min").astype(int),
    )
