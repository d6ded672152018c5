"""Days of a dataset, and its examples in time order (``--data.order=time``).

Continual training reads the logs in the order they were written, day after day, and scores
each day's model on the next day (GBA, Su et al. 2022, Sec. 5.1-5.2, Fig. 6; MLPerf DLRM
scores a later window). Two kinds of data know their days here:

* **synthetic** with ``synthetic.days`` (`recjax.data.synthetic`): example ``r`` of ``n`` is of
  day ``r * days // n``; its examples are i.i.d. draws, so time order is the stream itself;
* **a Parquet dataset** (`recjax.data.columnar`) converted from one input per day (Criteo-1TB's
  ``day_0`` ... ``day_23``, in the order given to ``scripts/convert.py``): file ``i`` is day
  ``i``, and the day of an example is that of the file its ``row`` lies in.

`TimeWindows` is the time order of a Parquet dataset: its days in order, each day's examples
shuffled only among themselves, in consecutive windows of ``window`` examples (window ``w``
permuted by ``(seed, 9, w)``; the same permutation every epoch: a day-ordered run reads its
data once). No example moves out of its day or further than one window. The view is a seekable
source like any other (`recjax.data.seek`): the pipeline runs it in file order, and a resume
reads none of the windows before its batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np

from recjax.batch import Chunk, take


def _inner(source):
    """The source under caching and counting views (`CachedSource`, `Counted`, ...)."""
    while hasattr(source, "source") and not hasattr(source, "day_first_rows"):
        source = source.source
    return source


def has_days(source) -> bool:
    """Whether `source` knows the day of each example (synthetic days, Parquet files)."""
    inner = _inner(source)
    return hasattr(inner, "day_first_rows") or callable(getattr(inner, "days", None))


def days_of(source, rows: np.ndarray) -> np.ndarray:
    """The day of each example ``row`` of `source` (0-based, in time order)."""
    inner = _inner(source)
    if hasattr(inner, "day_first_rows"):
        first = np.asarray(inner.day_first_rows(), np.int64)
        return np.searchsorted(first, np.asarray(rows, np.int64), side="right") - 1
    return inner.days(np.asarray(rows, np.int64))


def num_days(source) -> int:
    inner = _inner(source)
    if hasattr(inner, "day_first_rows"):
        return len(inner.day_first_rows())
    return int(inner.cfg.days)


def day_starts(source) -> np.ndarray:
    """Stream positions at which each day starts, plus the pass's length at the end
    (i64[days + 1]); the days must come in order in the stream (checked)."""
    sizes = source.chunk_sizes()
    starts, first = [0], 0
    last_day = 0
    for c, size in enumerate(sizes):
        day = days_of(source, source.chunk_row_ids(c))
        if day.size and (day[0] < last_day or np.any(np.diff(day) < 0)):
            raise ValueError(f"{source.name}: its days are not in stream order (chunk {c}); "
                             "data.order=time needs the days in order")
        for d in range(last_day + 1, int(day[-1]) + 1 if day.size else 0):
            starts.append(first + int(np.searchsorted(day, d)))
        if day.size:
            last_day = max(last_day, int(day[-1]))
        first += size
    starts += [first] * (num_days(source) - len(starts) + 1)
    return np.asarray(starts, np.int64)


class TimeWindows:
    """`source` in time order, each day shuffled within windows of `window` examples (the
    module docstring). A `DataSource` that seeks when `source` does."""

    def __init__(self, source, window: int, seed: int):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.source, self.window, self.seed = source, window, seed
        self.name, self.spec = source.name, source.spec
        days = day_starts(source)
        bounds = [np.arange(a, b, window) for a, b in zip(days[:-1], days[1:])]
        self.bounds = np.concatenate([*bounds, days[-1:]]).astype(np.int64)
        self.day_starts = days

    def __getattr__(self, name: str):  # stats, num_rows, rows_read, days: the source's
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    @functools.lru_cache(maxsize=8)  # noqa: B019 (one view per run; a few windows at a time)
    def _perm(self, w: int) -> np.ndarray:
        """Stream positions of `source` that window `w`'s slots hold, in order."""
        lo, hi = int(self.bounds[w]), int(self.bounds[w + 1])
        return lo + np.random.default_rng([self.seed, 9, w]).permutation(hi - lo)

    def _source_positions(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, np.int64)
        w = np.searchsorted(self.bounds, positions, side="right") - 1
        out = np.empty_like(positions)
        for u in np.unique(w):
            at = w == u
            out[at] = self._perm(int(u))[positions[at] - self.bounds[u]]
        return out

    # -- a seekable source (recjax.data.seek) ------------------------------------------------
    def seekable(self) -> bool:
        check = getattr(self.source, "seekable", None)
        return bool(check()) if callable(check) else False

    def chunk_sizes(self) -> list[int]:
        return np.diff(self.bounds).tolist()

    def chunk_row_ids(self, c: int) -> np.ndarray:
        perm = self._perm(c)
        starts = np.concatenate([[0], np.cumsum(self.source.chunk_sizes(), dtype=np.int64)])
        unit = np.searchsorted(starts, perm, side="right") - 1
        out = np.empty(perm.size, np.int64)
        for u in np.unique(unit):
            at = unit == u
            out[at] = self.source.chunk_row_ids(int(u))[perm[at] - starts[u]]
        return out

    def take_rows(self, positions: np.ndarray) -> Chunk:
        return self.source.take_rows(self._source_positions(positions))

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """A pass, window by window, from stream position `start` on."""
        first = int(np.searchsorted(self.bounds, start, side="right") - 1)
        for w in range(max(first, 0), len(self.bounds) - 1):
            chunk = self.source.take_rows(self._perm(w))
            if start > self.bounds[w]:
                chunk = take(chunk, slice(start - int(self.bounds[w]), None))
            yield chunk
