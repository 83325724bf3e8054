"""How the reports write numbers and tables: Markdown tables, metric means, signed and plain cells.

Shared by the benchmark table, the results page, the quality tables and README's tables, so the
same number is printed the same way everywhere.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["markdown_table", "format_value", "number_cell", "p_value_cell"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a Markdown table."""
    return ["| " + " | ".join(cells) + " |" for cells in (header, ["---"] * len(header), *rows)]


def format_value(value: float, key: str) -> str:
    """A metric mean as the tables print it: HD95 with 2 decimals, the rest with 3, NaN as n/a."""
    if value != value:  # NaN
        return "n/a"
    return f"{value:.2f}" if key == "hd95_mean" else f"{value:.3f}"


def number_cell(value: float, digits: int = 2, signed: bool = False) -> str:
    """``value`` with ``digits`` decimals (a sign always shown when ``signed``), NaN as n/a."""
    if value != value:  # NaN
        return "n/a"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def p_value_cell(p_value: float) -> str:
    """A test's p: three decimals, ``< 0.001`` below that, NaN (no test possible) as n/a."""
    if p_value != p_value:  # NaN
        return "n/a"
    return "< 0.001" if p_value < 0.001 else f"{p_value:.3f}"
