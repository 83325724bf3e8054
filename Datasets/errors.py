"""The one error of the data stage: data that cannot be used, said in one sentence that also says what to do.

Every module of ``Datasets/`` raises it, and the commands of the later stages print it after ``error: ``.
"""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """The training data cannot be used; the message says what is wrong and what to do."""
