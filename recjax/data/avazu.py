"""Avazu CTR prediction (Kaggle 2014): ``avazu:PATH``.

Layout: comma-separated, 24 columns ``id,click,hour,C1,banner_pos,site_id,...,C21``. The
original ``train.csv`` has this header; split files often do not, so the header is optional
(present iff the first token of the first line is ``id``) and must match exactly when present.

Features (no dense columns, ``dense`` is f32[B, 0]):

* label = ``click`` (0/1); ``id`` (a 64-bit impression id, unique per row) is dropped unread.
* ``hour`` (``YYMMDDHH``, UTC) becomes two exact-vocabulary fields, ``hour_of_day`` (24 ids)
  and ``weekday`` (7 ids, Monday = 0): the absolute hour never repeats between train and test,
  so it would only be noise; the daily and weekly cycles do repeat.
* the other 21 columns are categorical strings, each hashed on its own into ``hash_buckets``
  buckets; they must be UTF-8 text (bytes that do not decode mean a corrupt file). An empty
  value is its own category.
* ``raw_ids=True`` (dynamic-id stores): the 21 columns become raw i64 ids instead
  (`recjax.data.hashing.raw_ids`, field = the spec index 2..22): 8-hex-digit ids (``site_id``,
  ``device_ip``, ...) and decimal integers (``C1``, ``C14``..``C21``, ``-1`` included) are exact,
  so they never collide; any other token is hashed and counted in ``raw_hashed``. Those fields'
  ``vocab_size`` is then `recjax.features.RAW_VOCAB`; ``hour_of_day`` and ``weekday`` keep their
  exact ids and vocabularies (as i64).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

import numpy as np

from recjax.data.hashing import CategoricalIds
from recjax.data.readers import (
    HOUR_VOCAB,
    WEEKDAY_VOCAB,
    Problems,
    TextSource,
    block_ints,
    block_label,
    block_text,
    check_text,
    distinct_times,
    parse_ints,
    parse_label,
)
from recjax.features import RAW_VOCAB, FeatureSpec, FieldSpec

COLUMNS = ("id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category",
           "app_id", "app_domain", "app_category", "device_id", "device_ip", "device_model",
           "device_type", "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20",
           "C21")
CAT_NAMES = COLUMNS[3:]
LABELS = {b"0": 0.0, b"1": 1.0}


def avazu_spec(hash_buckets: int, raw_ids: bool = False) -> FeatureSpec:
    """hour_of_day, weekday (exact ids), then the 21 hashed (or raw-id) categorical columns."""
    vocab = RAW_VOCAB if raw_ids else hash_buckets
    fields = (FieldSpec("hour_of_day", HOUR_VOCAB), FieldSpec("weekday", WEEKDAY_VOCAB),
              *(FieldSpec(name, vocab) for name in CAT_NAMES))
    return FeatureSpec(dense_names=(), fields=fields)


def _yymmddhh(value: int) -> datetime.datetime:
    if not 0 <= value < 10**8:
        raise ValueError(value)
    yy, mm, dd, hh = value // 10**6, value // 10**4 % 100, value // 100 % 100, value % 100
    return datetime.datetime(2000 + yy, mm, dd, hh)  # ValueError for a bad date or hour


def parse_yymmddhh(tokens: Sequence[bytes], field: str, bad: Problems
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(hour of day, weekday) of ``YYMMDDHH`` tokens; calendar checks run once per distinct hour."""
    values = parse_ints(tokens, field, bad, allow_missing=False)
    return distinct_times(values, tokens, field, bad, _yymmddhh,
                        "YYMMDDHH (e.g. 14102100 = 2014-10-21 00:00)")


class AvazuSource(CategoricalIds, TextSource):
    """``avazu:PATH``: the Avazu CSV layout, with or without its header line."""

    kind = "avazu"
    delimiter = b","
    columns = COLUMNS
    header = "optional"

    def __init__(self, path: str | os.PathLike, *, hash_buckets: int = 1 << 17,
                 raw_ids: bool = False, name: str | None = None, skip_bad_lines: bool = False,
                 chunk_rows: int = 65536):
        self.init_ids(hash_buckets, raw_ids)
        super().__init__(path, spec=avazu_spec(hash_buckets, raw_ids), name=name,
                         skip_bad_lines=skip_bad_lines, chunk_rows=chunk_rows)

    def convert(self, cols: list[Sequence[bytes]], bad: Problems):
        n = len(cols[0])
        label = parse_label(cols[1], "click", bad, LABELS)
        ids = np.empty((n, self.spec.n_fields, 1), self.id_dtype)
        ids[:, 0, 0], ids[:, 1, 0] = parse_yymmddhh(cols[2], "hour", bad)
        for k, name in enumerate(CAT_NAMES, start=2):
            tokens = cols[COLUMNS.index(name)]
            check_text(tokens, name, bad)
            ids[:, k, 0] = self.categorical_ids(tokens, name, k)
        return np.zeros((n, 0), np.float32), ids, None, label

    def convert_block(self, cols: list):
        """`convert` of a block of good lines without a Python object per token but the
        distinct hours' and the non-8-byte tokens' (readers.py), or None when any value is not
        plainly good; every check runs before the first id is made (as Criteo's)."""
        n = len(cols[0])
        label = block_label(cols[1], LABELS)
        hours = None if label is None else block_ints(cols[2], allow_missing=False)
        if hours is None:
            return None
        uniq, inverse = np.unique(hours, return_inverse=True)
        try:
            when = [_yymmddhh(int(v)) for v in uniq]
        except ValueError:
            return None
        tokens = [block_text(cols[COLUMNS.index(name)]) for name in CAT_NAMES]
        if any(t is None for t in tokens):
            return None
        ids = np.empty((n, self.spec.n_fields, 1), self.id_dtype)
        ids[:, 0, 0] = np.array([w.hour for w in when], np.int32)[inverse]
        ids[:, 1, 0] = np.array([w.weekday() for w in when], np.int32)[inverse]
        for k, name in enumerate(CAT_NAMES, start=2):
            ids[:, k, 0] = self.categorical_ids(tokens[k - 2], name, k)
        return np.zeros((n, 0), np.float32), ids, None, label
