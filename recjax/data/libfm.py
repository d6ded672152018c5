"""libFM one-hot files with a fixed field layout, and Frappe: ``frappe:PATH``.

Layout: whitespace-separated ``label idx:val idx:val ...``, exactly one ``idx:val`` per field,
in field order (the NFM/AFM "libFM with fields" convention). The label is ``1``/``+1`` (click)
or ``-1``/``0`` (no click). Every value must be 1: the batch carries ids only, so a weighted
feature would be silently read as 1, and is refused instead.

The feature ids are global (one id space for all fields), so all fields look up ONE shared
table of ``vocab_size`` rows (`FieldSpec.table`): the id is used as given, no hashing. For
Frappe that is the documented 5,382 features (ids 0..5381) in 10 fields.

``raw_ids=True`` (dynamic-id stores) changes only the dtype of ``ids`` to i64: the ids are exact
already, so they and the vocabulary stay as they are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from recjax.data.readers import Problems, TextSource, parse_ints, parse_label, show
from recjax.features import FeatureSpec, FieldSpec

LABELS = {b"1": 1.0, b"+1": 1.0, b"-1": 0.0, b"0": 0.0}
FRAPPE_FIELDS = ("user", "item", "daytime", "weekday", "isweekend", "homework", "cost",
                 "weather", "country", "city")
FRAPPE_VOCAB = 5382  # feature ids 0..5381 (frappe README / NFM data)


class LibFMSource(TextSource):
    """A libFM file with one ``idx:1`` per field, all fields sharing one table of exact ids.

    Args:
      path: the file.
      fields: field names, in line order.
      vocab_size: feature ids must lie in ``[0, vocab_size)``.
      table: name of the shared table.
      raw_ids: emit i64 ids (same values; see the module docstring).
    """

    kind = "libfm"
    delimiter = None  # any whitespace; also swallows the CR of CRLF files like Frappe's

    def __init__(self, path: str | os.PathLike, *, fields: tuple[str, ...], vocab_size: int,
                 table: str, raw_ids: bool = False, name: str | None = None,
                 skip_bad_lines: bool = False, chunk_rows: int = 65536):
        self.columns = ("label", *fields)
        self.vocab_size = vocab_size
        self.raw_ids = raw_ids
        spec = FeatureSpec(dense_names=(),
                           fields=tuple(FieldSpec(f, vocab_size, table=table) for f in fields))
        super().__init__(path, spec=spec, name=name, skip_bad_lines=skip_bad_lines,
                         chunk_rows=chunk_rows)

    def convert(self, cols: list[Sequence[bytes]], bad: Problems):
        n = len(cols[0])
        label = parse_label(cols[0], "label", bad, LABELS)
        ids = np.empty((n, self.spec.n_fields, 1), np.int64 if self.raw_ids else np.int32)
        for k, field in enumerate(self.columns[1:]):
            ids[:, k, 0] = self._feature_ids(cols[k + 1], field, bad)
        return np.zeros((n, 0), np.float32), ids, None, label

    def _feature_ids(self, tokens: Sequence[bytes], field: str, bad: Problems) -> np.ndarray:
        parts = [t.partition(b":") for t in tokens]
        idx = [p[0] for p in parts]
        values = [p[2] for p in parts]
        if [p[1] for p in parts].count(b":") != len(parts):
            for i, p in enumerate(parts):
                if not p[1]:
                    bad.add(i, field, f"not idx:value: got {show(tokens[i])}")
        ids = parse_ints(idx, field, bad, allow_missing=False)
        for i in np.flatnonzero((ids < 0) | (ids >= self.vocab_size)):
            bad.add(i, field, f"feature id out of range: got {ids[i]}, expected 0.."
                              f"{self.vocab_size - 1}")
        if values.count(b"1") != len(values):  # slow path only for unusual values
            for i, v in enumerate(values):
                try:
                    one = float(v) == 1.0
                except ValueError:
                    one = False
                if not one:
                    bad.add(i, field, f"feature value not 1: got {show(v)}; this reader takes "
                                      "one-hot features (idx:1) only")
        return np.clip(ids, 0, self.vocab_size - 1)  # bad rows are dropped or raised anyway


class FrappeSource(LibFMSource):
    """``frappe:PATH``: Frappe in the NFM libFM split (10 fields, 5,382 ids, one table)."""

    kind = "frappe"

    def __init__(self, path: str | os.PathLike, *, raw_ids: bool = False, name: str | None = None,
                 skip_bad_lines: bool = False, chunk_rows: int = 65536):
        super().__init__(path, fields=FRAPPE_FIELDS, vocab_size=FRAPPE_VOCAB, table="frappe",
                         raw_ids=raw_ids, name=name, skip_bad_lines=skip_bad_lines,
                         chunk_rows=chunk_rows)
