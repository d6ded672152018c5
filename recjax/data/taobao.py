"""Taobao display-ad clicks with a click sequence (FuxiCTR's tiny CSV): ``taobao:PATH``.

Layout: comma-separated with the header ``clk,time_stamp,userid,adgroup_id,...,click_sequence``
(19 columns, `COLUMNS`).

Features:

* label = ``clk`` (0/1).
* dense ``price`` -> ``log1p(max(x, 0))``; empty = 0.
* ``time_stamp`` (``YYYY-MM-DD HH:MM:SS``) -> ``hour_of_day`` (24) and ``weekday`` (7) fields.
* the 15 profile/ad columns: one-hot, each hashed on its own into ``hash_buckets`` buckets
  (UTF-8 text; empty = its own category, as FuxiCTR does).
* ``click_sequence``: ``^``-separated ids, a multi-hot field of ``max_len`` = ``multi_hot_len``
  ids that shares the ``adgroup_id`` table (as FuxiCTR's ``share_embedding``), so a clicked id
  and the same ad group hash to the same row. Longer sequences keep their first ``max_len`` ids;
  the number of truncated examples is counted in ``stats.truncated``. An empty sequence is all
  padding (mask 0).

``mask`` is f32[B, F, L]: 1 at real ids; a one-hot field has its id at position 0 only.

``raw_ids=True`` (dynamic-id stores): the 15 one-hot columns and ``click_sequence`` become raw
i64 ids (`recjax.data.hashing.raw_ids`, field = the table's salt, so a clicked id and the same ad
group still share an id): decimal ids (``userid``, ``adgroup_id``, ...) are exact; other tokens
(``pid`` such as ``430548_1007``) are hashed and counted in ``raw_hashed``. Those fields'
``vocab_size`` is then `recjax.features.RAW_VOCAB`; ``hour_of_day``/``weekday`` keep their exact
ids and vocabularies (as i64). Padding stays 0, never a raw id.
"""

from __future__ import annotations

import datetime
import itertools
import os
from collections.abc import Sequence

import numpy as np

from recjax.data.hashing import CategoricalIds
from recjax.data.readers import (
    HOUR_VOCAB,
    WEEKDAY_VOCAB,
    Problems,
    TextSource,
    check_text,
    distinct_times,
    log1p_counts,
    parse_floats,
    parse_label,
    show,
    table_salt,
)
from recjax.features import RAW_VOCAB, FeatureSpec, FieldSpec

COLUMNS = ("clk", "time_stamp", "userid", "adgroup_id", "pid", "cate_id", "campaign_id",
           "customer", "brand", "price", "cms_segid", "cms_group_id", "final_gender_code",
           "age_level", "pvalue_level", "shopping_level", "occupation", "new_user_class_level",
           "click_sequence")
CAT_NAMES = tuple(c for c in COLUMNS[2:-1] if c != "price")
SEQUENCE, SHARES = "click_sequence", "adgroup_id"
LABELS = {b"0": 0.0, b"1": 1.0}


def taobao_spec(hash_buckets: int, max_len: int, raw_ids: bool = False) -> FeatureSpec:
    vocab = RAW_VOCAB if raw_ids else hash_buckets
    fields = (FieldSpec("hour_of_day", HOUR_VOCAB), FieldSpec("weekday", WEEKDAY_VOCAB),
              *(FieldSpec(name, vocab) for name in CAT_NAMES),
              FieldSpec(SEQUENCE, vocab, max_len=max_len, table=SHARES))
    return FeatureSpec(dense_names=("price",), fields=fields)


def parse_datetime(tokens: Sequence[bytes], field: str, bad: Problems
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(hour of day, weekday) of ``YYYY-MM-DD HH:MM:SS`` tokens, parsed once per distinct value."""
    return distinct_times(tokens, tokens, field, bad, lambda t: datetime.datetime.strptime(
        t.decode("ascii"), "%Y-%m-%d %H:%M:%S"), "YYYY-MM-DD HH:MM:SS")


class TaobaoSource(CategoricalIds, TextSource):
    """``taobao:PATH``: one-hot ad/profile fields plus the multi-hot ``click_sequence``."""

    kind = "taobao"
    delimiter = b","
    columns = COLUMNS
    header = "required"

    def __init__(self, path: str | os.PathLike, *, hash_buckets: int = 1 << 17,
                 multi_hot_len: int = 20, raw_ids: bool = False, name: str | None = None,
                 skip_bad_lines: bool = False, chunk_rows: int = 65536):
        if multi_hot_len < 2:
            # With L = 1 the batch contract drops the mask, and an empty sequence needs one.
            raise ValueError(f"multi_hot_len must be >= 2 for {SEQUENCE}, got {multi_hot_len}")
        self.init_ids(hash_buckets, raw_ids)
        self.max_len = multi_hot_len
        super().__init__(path, spec=taobao_spec(hash_buckets, multi_hot_len, raw_ids), name=name,
                         skip_bad_lines=skip_bad_lines, chunk_rows=chunk_rows)

    def convert(self, cols: list[Sequence[bytes]], bad: Problems):
        n, n_fields = len(cols[0]), self.spec.n_fields
        label = parse_label(cols[0], "clk", bad, LABELS)
        dense = log1p_counts(parse_floats(cols[COLUMNS.index("price")], "price", bad))[:, None]
        ids = np.zeros((n, n_fields, self.max_len), self.id_dtype)
        mask = np.zeros((n, n_fields, self.max_len), np.float32)
        mask[:, :-1, 0] = 1.0  # every one-hot field has exactly one real id
        ids[:, 0, 0], ids[:, 1, 0] = parse_datetime(cols[1], "time_stamp", bad)
        for k, name in enumerate(CAT_NAMES, start=2):
            tokens = cols[COLUMNS.index(name)]
            check_text(tokens, name, bad)
            ids[:, k, 0] = self.categorical_ids(tokens, name, table_salt(self.spec, name))
        self._sequence(cols[-1], ids, mask, bad)
        return dense, ids, mask, label

    def _sequence(self, tokens: Sequence[bytes], ids: np.ndarray, mask: np.ndarray,
                  bad: Problems) -> None:
        """Fill the last field of `ids`/`mask` from ``^``-separated id lists."""
        check_text(tokens, SEQUENCE, bad)
        seqs = [t.split(b"^") if t else [] for t in tokens]
        lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
        for i, seq in enumerate(seqs):
            if b"" in seq:
                bad.add(i, SEQUENCE, f"empty id in sequence: got {show(tokens[i])}, expected "
                                     "ids separated by single '^'")
        # Counted before bad lines are dropped: a line both bad and long counts here too.
        self.stats.truncated[SEQUENCE] += int(np.sum(lengths > self.max_len))
        kept = np.minimum(lengths, self.max_len)
        flat = list(itertools.chain.from_iterable(s[: self.max_len] for s in seqs))
        rows = np.repeat(np.arange(len(seqs)), kept)
        pos = np.arange(len(flat)) - np.repeat(np.cumsum(kept) - kept, kept)
        salt = table_salt(self.spec, SEQUENCE)
        ids[rows, -1, pos] = self.categorical_ids(flat, SEQUENCE, salt)
        mask[rows, -1, pos] = 1.0
