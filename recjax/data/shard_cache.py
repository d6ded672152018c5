"""One worker's share of a source, kept in memory: what a host-async worker in a process of its
own (a Ray worker actor with its role, ``algorithms/runtime/ray_roles.py``) reads, without
holding the whole pass.

Worker ``w`` of ``W`` trains on the examples with ``row % W == w`` (`recjax.data.stages.select`).
A whole-pass cache (`recjax.data.pipeline.CachedSource`) in each of W worker processes holds
the pass W times over (dlrm_kaggle's 4M synthetic rows: 1.76 GB per worker actor). `ShardCache`
keeps only the worker's examples (or those of a group of workers that share one process: a
ShadowSync trainer's m Hogwild workers, m / W of the pass), and the pass's geometry beside
them (its chunk sizes and row ids, 8 bytes an example), so that the worker's stream is read by
position (`recjax.data.seek.selected`, `locate`/`resume` for a mid-epoch start) exactly as
from a whole-pass cache: the same positions, the same shuffle draws, the same batches
(tests/test_shard_cache.py). A position outside the share is an error, not a silent read.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import numpy as np

from recjax.batch import Chunk, take
from recjax.data import seek


class ShardCache:
    """`source`'s examples with ``row % num_workers == worker``, kept after one pass (`fill`).

    `worker` may be a tuple of workers: the examples of each of them are kept (a group of
    workers in one process reads each member's stream from the one cache). A pass of more
    than `max_rows` examples is not kept (as `CachedSource`): every method then reads
    `source`. Kept, the source is `random_access` and seeks by position; a whole pass
    (`chunks`) exists only where the share is every worker's (``num_workers == 1``).
    """

    def __init__(self, source, worker: int | tuple[int, ...], num_workers: int,
                 max_rows: int = 1_000_000):
        members = tuple(sorted({worker} if isinstance(worker, int) else set(worker)))
        if not members or not all(0 <= w < num_workers for w in members):
            raise ValueError(f"worker must be in [0, {num_workers}) (or a non-empty tuple of "
                             f"such), got {worker}")
        self.source, self.num_workers, self.max_rows = source, num_workers, max_rows
        self.members = members  # the workers whose examples are kept
        self._whole = len(members) == num_workers
        self.name, self.spec = source.name, source.spec
        self._sizes: list[int] | None = None  # the pass's chunk sizes
        self._rows: list[np.ndarray] = []  # each chunk's row ids
        self._kept: list[Chunk] = []  # the share's examples of each chunk, in stream order
        self._at: np.ndarray | None = None  # their stream positions, ascending
        self._stats = None
        self._too_big = False
        self._handed = 0

    def fill(self) -> None:
        """Read one pass of `source` and keep the share (once)."""
        if self._sizes is not None or self._too_big:
            return
        sizes, rows, kept, at, first, total = [], [], [], [], 0, 0
        for chunk in self.source.chunks():
            total += chunk.size
            if total > self.max_rows:  # too big to keep: read from the source every time
                self._too_big = True
                return
            mine = np.flatnonzero(self._mine(chunk.row))
            sizes.append(chunk.size)
            rows.append(np.array(chunk.row, np.int64))
            if mine.size:
                kept.append(take(chunk, mine))
                at.append(first + mine)
            first += chunk.size
        self._sizes, self._rows = sizes, rows
        self._kept = kept  # per chunk, not concatenated: a copy would double the peak
        for chunk in kept:
            for a in chunk:
                if a is not None:
                    a.flags.writeable = False  # a consumer writing into a batch fails loudly
        self._at = np.concatenate(at) if at else np.zeros(0, np.int64)
        self._stats = copy.deepcopy(self.source.stats)

    def _mine(self, row: np.ndarray) -> np.ndarray:
        """Whether each of the rows `row` belongs to the share (boolean mask)."""
        if self._whole:
            return np.ones(row.shape, bool)
        w = row % self.num_workers
        if len(self.members) == 1:
            return w == self.members[0]
        return np.isin(w, self.members)

    @property
    def kept_rows(self) -> int | None:
        """Examples kept in memory (None: not kept, read from the source)."""
        return sum(c.size for c in self._kept) if self._sizes is not None else None

    @property
    def random_access(self) -> bool:
        return self._sizes is not None

    @property
    def stats(self):
        return self._stats if self._stats is not None else self.source.stats

    @property
    def rows_read(self) -> int:
        return self._handed + getattr(self.source, "rows_read", 0)

    def seekable(self) -> bool:
        return self._sizes is not None or seek.seekable(self.source)

    def chunk_sizes(self) -> list[int]:
        return list(self._sizes) if self._sizes is not None else self.source.chunk_sizes()

    def chunk_row_ids(self, c: int) -> np.ndarray:
        return self._rows[c] if self._sizes is not None else self.source.chunk_row_ids(c)

    def take_rows(self, positions: np.ndarray) -> Chunk:
        if self._sizes is None:
            return self.source.take_rows(positions)
        positions = np.asarray(positions, np.int64)
        idx = np.searchsorted(self._at, positions)
        ok = (idx < self._at.size) & (self._at[np.minimum(idx, self._at.size - 1)] == positions)
        if positions.ndim != 1 or not positions.size or not ok.all():
            bad = positions[~ok][:3] if positions.ndim == 1 else positions
            raise IndexError(f"{self.name}: stream positions {bad.tolist()} are not in the share "
                             f"of {self._who()} of {self.num_workers} this cache holds")
        self._handed += positions.size
        return seek.gather([c.size for c in self._kept], self._kept.__getitem__, idx)

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """A pass from stream position `start`, cut where the source cuts it (a mid-epoch
        start feeds the shuffle chunk by chunk, as `recjax.data.seek.locate` replayed it);
        only where the share is the whole pass: one worker."""
        if self._sizes is None:
            yield from self.source.chunks(start) if start else self.source.chunks()
            return
        if not self._whole:
            raise ValueError(f"{self.name}: this cache holds {self._who()} of "
                             f"{self.num_workers}'s share, not a whole pass; read it by position "
                             "(recjax.data.seek.selected)")
        first = 0
        for chunk in self._kept:  # (every worker's: every chunk whole)
            if start < first + chunk.size:
                lo = max(start - first, 0)
                self._handed += chunk.size - lo
                yield take(chunk, slice(lo, None)) if lo else chunk
            first += chunk.size

    def _who(self) -> str:
        m = self.members
        return f"worker {m[0]}" if len(m) == 1 else f"workers {', '.join(map(str, m))}"
