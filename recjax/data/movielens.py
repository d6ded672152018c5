"""MovieLens ratings as a CTR task: ``movielens:PATH`` (the ML-100K ``u.data`` layout).

Layout: tab-separated ``user_id, item_id, rating, timestamp``, no header.

Features (no dense columns):

* label = ``rating >= 4`` (the usual "liked it" binarisation); ratings must be integers 1..5.
* ``user`` and ``item``: the ids as given (1-based, so row 0 of each table is never used), with
  exact vocabularies ``n_users + 1`` and ``n_items + 1`` read from the ``u.info`` file that
  GroupLens ships next to ``u.data`` (ML-100K's 943 / 1,682 when it is absent). An id outside
  that range is an error, never a silent collision.
* ``hour_of_day`` (24) and ``weekday`` (7, Monday = 0) of the UTC timestamp.

``raw_ids=True`` (dynamic-id stores) changes only the dtype of ``ids`` to i64: the ids are exact
already, so they and the vocabularies stay as they are.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from recjax.data.base import DataError
from recjax.data.readers import (
    HOUR_VOCAB,
    WEEKDAY_VOCAB,
    Problems,
    TextSource,
    hour_weekday,
    parse_ints,
)
from recjax.features import FeatureSpec, FieldSpec

ML100K_USERS, ML100K_ITEMS = 943, 1682


def read_info(data_path: str) -> tuple[int, int]:
    """(n_users, n_items) from ``u.info`` beside the ratings file, else ML-100K's counts."""
    info = os.path.join(os.path.dirname(os.path.abspath(data_path)), "u.info")
    if not os.path.isfile(info):
        return ML100K_USERS, ML100K_ITEMS
    with open(info, encoding="utf-8", errors="replace") as f:
        counts = dict((m.group(2), int(m.group(1)))
                      for m in re.finditer(r"(\d+)\s+(users|items)", f.read()))
    if set(counts) != {"users", "items"}:
        raise DataError(info, None, None, "u.info does not give '<n> users' and '<n> items'",
                        "Restore the GroupLens u.info file or remove it to use ML-100K's sizes")
    return counts["users"], counts["items"]


class MovieLensSource(TextSource):
    """``movielens:PATH``: ``user \\t item \\t rating \\t timestamp`` lines."""

    kind = "movielens"
    delimiter = b"\t"
    columns = ("user_id", "item_id", "rating", "timestamp")

    def __init__(self, path: str | os.PathLike, *, raw_ids: bool = False, name: str | None = None,
                 skip_bad_lines: bool = False, chunk_rows: int = 65536):
        self.n_users, self.n_items = read_info(str(path))
        self.raw_ids = raw_ids
        spec = FeatureSpec(dense_names=(), fields=(
            FieldSpec("user", self.n_users + 1), FieldSpec("item", self.n_items + 1),
            FieldSpec("hour_of_day", HOUR_VOCAB), FieldSpec("weekday", WEEKDAY_VOCAB)))
        super().__init__(path, spec=spec, name=name, skip_bad_lines=skip_bad_lines,
                         chunk_rows=chunk_rows)

    def convert(self, cols: list[Sequence[bytes]], bad: Problems):
        n = len(cols[0])
        ids = np.empty((n, 4, 1), np.int64 if self.raw_ids else np.int32)
        for k, (col, top) in enumerate([("user_id", self.n_users), ("item_id", self.n_items)]):
            values = parse_ints(cols[k], col, bad, allow_missing=False)
            for i in np.flatnonzero((values < 1) | (values > top)):
                bad.add(i, col, f"id out of range: got {values[i]}, expected 1..{top} "
                                "(the sizes in u.info)")
            ids[:, k, 0] = np.clip(values, 0, top)
        rating = parse_ints(cols[2], "rating", bad, allow_missing=False)
        for i in np.flatnonzero((rating < 1) | (rating > 5)):
            bad.add(i, "rating", f"rating out of range: got {rating[i]}, expected 1..5")
        seconds = parse_ints(cols[3], "timestamp", bad, allow_missing=False)
        for i in np.flatnonzero(seconds < 0):
            bad.add(i, "timestamp", f"negative timestamp: got {seconds[i]}")
        ids[:, 2, 0], ids[:, 3, 0] = hour_weekday(np.maximum(seconds, 0))
        label = (rating >= 4).astype(np.float32)
        return np.zeros((n, 0), np.float32), ids, None, label
