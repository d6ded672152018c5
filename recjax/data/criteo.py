"""Criteo Display Advertising Challenge (Kaggle 2014): the TSV and the Kaggle CSV layouts.

* ``criteo:PATH``: ``train.txt`` layout, tab-separated, no header, 40 fields:
  ``label, I1..I13, C1..C26``.
* ``criteo-csv:PATH``: Kaggle's ``train.csv`` layout, comma-separated, header
  ``Id,Label,I1..I13,C1..C26``; ``Id`` is ignored.

Features (the DLRM recipe):

* dense ``I1..I13`` -> ``log1p(max(x, 0))``; a missing (empty) value is 0, like a zero count.
  Negative values (Criteo has a few ``-1``/``-2``) also map to 0. So no NaN/inf reaches a batch.
* categorical ``C1..C26``: lowercase hex strings, each field hashed on its own into
  ``hash_buckets`` buckets (`recjax.data.hashing`); empty (missing) is its own category, the
  bucket of ``b""``.
* ``raw_ids=True`` (dynamic-id stores): ``C1..C26`` become raw i64 ids instead
  (`recjax.data.hashing.raw_ids`, field = k for ``C{k+1}``): an 8-hex-digit token is its exact
  32-bit value, so no two tokens collide; a token of another length that is not a decimal
  integer is hashed and counted in ``raw_hashed`` (none in the real logs). The fields'
  ``vocab_size`` is then `recjax.features.RAW_VOCAB`.

Every field is validated: label in {0, 1}, I* decimal integers, C* lowercase hex.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from recjax.data.base import DataError
from recjax.data.hashing import CategoricalIds
from recjax.data.readers import (
    Problems,
    TextSource,
    block_hex,
    block_ints,
    block_label,
    check_hex,
    log1p_counts,
    parse_ints,
    parse_label,
)
from recjax.features import RAW_VOCAB, FeatureSpec, FieldSpec

INT_NAMES = tuple(f"I{i}" for i in range(1, 14))
CAT_NAMES = tuple(f"C{i}" for i in range(1, 27))
LABELS = {b"0": 0.0, b"1": 1.0}


def criteo_spec(hash_buckets: int, raw_ids: bool = False) -> FeatureSpec:
    """13 dense columns and 26 hashed (or raw-id) one-hot fields, each with its own table."""
    vocab = RAW_VOCAB if raw_ids else hash_buckets
    return FeatureSpec(dense_names=INT_NAMES,
                       fields=tuple(FieldSpec(name, vocab) for name in CAT_NAMES))


class CriteoSource(CategoricalIds, TextSource):
    """``criteo:PATH``: the Criteo ``train.txt`` TSV layout (no header)."""

    kind = "criteo"
    delimiter = b"\t"
    columns = ("label", *INT_NAMES, *CAT_NAMES)

    def __init__(self, path: str | os.PathLike, *, hash_buckets: int = 1 << 17,
                 raw_ids: bool = False, name: str | None = None, skip_bad_lines: bool = False,
                 chunk_rows: int = 65536):
        self.init_ids(hash_buckets, raw_ids)
        super().__init__(path, spec=criteo_spec(hash_buckets, raw_ids), name=name,
                         skip_bad_lines=skip_bad_lines, chunk_rows=chunk_rows)

    def convert(self, cols: list[Sequence[bytes]], bad: Problems):
        at = self.columns.index(INT_NAMES[0]) - 1  # column of the label
        n = len(cols[0])
        label = parse_label(cols[at], self.columns[at], bad, LABELS)
        dense = np.empty((n, len(INT_NAMES)), np.float32)
        for j, name in enumerate(INT_NAMES):
            dense[:, j] = log1p_counts(parse_ints(cols[at + 1 + j], name, bad))
        ids = np.empty((n, len(CAT_NAMES), 1), self.id_dtype)
        for k, name in enumerate(CAT_NAMES):
            tokens = cols[at + 1 + len(INT_NAMES) + k]
            check_hex(tokens, name, bad)
            ids[:, k, 0] = self.categorical_ids(tokens, name, k)
        return dense, ids, None, label

    def convert_block(self, cols: list):
        """`convert` of a block of good lines without a Python object per token (readers.py),
        or None when any value is not plainly good. Every check runs before the first id is
        made, so a block that goes back to `convert` has left no trace."""
        at = self.columns.index(INT_NAMES[0]) - 1
        n = len(cols[0])
        label = block_label(cols[at], LABELS)
        if label is None:
            return None
        dense = np.empty((n, len(INT_NAMES)), np.float32)
        for j in range(len(INT_NAMES)):
            values = block_ints(cols[at + 1 + j])
            if values is None:
                return None
            dense[:, j] = log1p_counts(values)
        tokens = [block_hex(c) for c in cols[at + 1 + len(INT_NAMES):]]
        if any(t is None for t in tokens):
            return None
        ids = np.empty((n, len(CAT_NAMES), 1), self.id_dtype)
        for k, name in enumerate(CAT_NAMES):
            ids[:, k, 0] = self.categorical_ids(tokens[k], name, k)
        return dense, ids, None, label


class CriteoCSVSource(CriteoSource):
    """``criteo-csv:PATH``: Kaggle's CSV layout with header ``Id,Label,I1..I13,C1..C26``."""

    kind = "criteo-csv"
    delimiter = b","
    columns = ("Id", "Label", *INT_NAMES, *CAT_NAMES)
    header = "required"

    def check_header(self, tokens: list[bytes]) -> None:
        names = [t.decode("utf-8", "replace") for t in tokens]
        if "Label" not in names and names == ["Id", *INT_NAMES, *CAT_NAMES]:
            raise DataError(self.path, 1, "Label", "bad header: no Label column",
                            "This is the layout of Kaggle's test.csv, which has no labels; "
                            "use a labelled file (train.csv) for training and evaluation")
        super().check_header(tokens)
