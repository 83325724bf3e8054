"""The store: one record per (bundle weights, case, member) of what the post-hoc fits read, written once by one
resumable pass (``calibseg-store``) and read by every fit (``calibseg-fit``) and study instead of running the
networks again.

- ``record.py``: :class:`StoreRecord`, the versioned stored schema (plain JSON, no pickle), validated on read.
- ``inputs.py``: :class:`InputRecord`, what the input check's fit reads of a case (its image statistics against
  the reference, every member's encoder vector).
- ``files.py``: where a record lives (``<store>/<weights_sha256[:16]>/<case>.<member>.json``, input records under
  ``inputs/<case>.json``, a degraded copy's under ``degraded/<degradation>/``), writing it atomically and reading
  a bundle's records back.

The schema imports neither the bundle nor the predictor; the pass that fills the store sits above
(:mod:`Training.store_pass`).
"""

from CalibSegLib.store.files import (input_record_path, read_fit_records, read_input_records, read_record,
                                    read_records, record_path, stored_input_cases, stored_keys, write_input_record,
                                    write_record)
from CalibSegLib.store.inputs import InputRecord, MemberEncoding
from CalibSegLib.store.record import ENSEMBLE, OUT_OF_FOLD, ROLES, STORE_VERSION, TEST, StoreError, StoreRecord

__all__ = ["STORE_VERSION", "OUT_OF_FOLD", "TEST", "ROLES", "ENSEMBLE", "StoreError", "StoreRecord", "InputRecord",
           "MemberEncoding", "record_path", "write_record", "read_record", "read_records", "read_fit_records",
           "stored_keys", "input_record_path", "write_input_record", "read_input_records", "stored_input_cases"]
