"""Benchmark records: what a benchmark measured, with which command, where and when, as JSON.

Every script in ``benchmarks/`` takes ``--record PATH`` and writes

    {"benchmark": "<script name>", "command": "-m benchmarks.<name> <flags>", "recorded": "YYYY-MM-DD",
     "environment": {"device", "cpu", "cpu_count", "torch_threads", "torch", "platform"},
     "results": {...}}       # the script's own numbers, documented in its record_table()

and formats its console table from the same record (``record_table(record) -> list[str]``), which the record keeps
as ``"table"``, so docs/performance.md's speed tables (copied by :mod:`Reporting.readme_tables` from
``docs/records/benchmark_<name>.json``) are exactly what the run printed.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["make_record", "write_record", "publish", "caption"]


def make_record(benchmark: str, results: dict[str, Any], argv: Sequence[str] | None = None,
                device: str = "cpu") -> dict[str, Any]:
    """The record of one benchmark run; ``argv`` are its flags (default: this process's), ``device``
    the one it measured on (named in the environment)."""
    from CalibSegLib.device import environment
    from CalibSegLib.io import recorded_path

    flags = [recorded_path(flag) if Path(flag).is_absolute() else flag
             for flag in (sys.argv[1:] if argv is None else argv)]
    if "--record" in flags:  # where the record went is not part of what was measured
        index = flags.index("--record")
        del flags[index:index + 2]
    return {"benchmark": benchmark, "command": " ".join(["-m", f"benchmarks.{benchmark}", *flags]),
            "recorded": datetime.date.today().isoformat(), "environment": environment(device), "results": results}


def write_record(path: str | Path | None, record: dict[str, Any], table: Sequence[str]) -> None:
    """Write ``record`` with the ``table`` lines its benchmark printed to ``path`` as JSON (atomically; nothing
    when ``path`` is None) and say where. The table goes into the record so that the documents' generator
    (:mod:`Reporting.readme_tables`) copies it without importing the benchmark."""
    if path is None:
        return
    from CalibSegLib.io import write_json_atomic

    print(f"record: {write_json_atomic(path, {**record, 'table': list(table)})}")


def publish(path: str | Path | None, record: dict[str, Any], format_table: Callable[[dict[str, Any]], list[str]]
            ) -> None:
    """Print the table ``format_table`` (the benchmark's ``record_table``) makes of ``record``, then write both to
    ``path`` (:func:`write_record`)."""
    table = format_table(record)
    print("\n".join(table))
    write_record(path, record, table)


def caption(record: dict[str, Any]) -> str:
    """One line under a benchmark table: the command, the machine and the date it was measured."""
    environment = record["environment"]
    device = environment.get("device", "?")
    machine = f"{environment.get('cpu', '?')}, {environment.get('cpu_count', '?')} cores, " \
              f"{environment.get('torch_threads', '?')} torch threads"
    return (f"`python {record['command']}` on {device if device != 'cpu' else 'the CPU'} ({machine}; torch "
            f"{environment.get('torch', '?')}, {environment.get('platform', '?')}), {record['recorded']}.")
