"""From a `DataSource` to fixed-shape batches: select, shard, shuffle, batch; plus caching.

``batches`` composes three streaming stages over the source's chunks:

1. **select**: keep the examples of this worker (``row % num_workers == worker``, round-robin
   by example index, so every worker sees the whole file's time range and the union over
   workers is exactly the stream, once) that pass ``keep(rows)`` (e.g. a hold-out split);
2. **shuffle**: a buffer of ``shuffle_buffer`` examples; each incoming example replaces a random
   one, which goes out (tf.data's shuffle, vectorised per chunk); at the end the rest of the
   buffer goes out in a random order. A buffer at least as large as the data is therefore a
   full permutation; 0 keeps file order. The numpy Generator is seeded with
   ``(seed, epoch, worker)``, so every epoch has its own order and a rerun repeats it exactly;
3. **batch**: fixed ``batch_size`` rows via `recjax.batch.to_batch`; the last partial batch is
   dropped (``drop_remainder``) or zero-padded, with ``n_valid`` telling how many rows are real.

Every stage keeps memory proportional to ``chunk_rows + shuffle_buffer + batch_size`` rows.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator

import numpy as np

from recjax.batch import Batch, Chunk, take, to_batch
from recjax.data import seek
from recjax.data.base import DataSource, ReadStats, all_skipped_error, count_rows
from recjax.data.hashing import uniform01
from recjax.data.stages import rebatch, select, shuffle  # noqa: F401 (re-exported)

Keep = Callable[[np.ndarray], np.ndarray]  # rows i64[N] -> bool[N]


def batches(source: DataSource, batch_size: int, *, seed: int, epoch: int, shuffle_buffer: int,
            drop_remainder: bool, worker: int = 0, num_workers: int = 1,
            keep: Keep | None = None, start: int = 0) -> Iterator[tuple[Batch, int]]:
    """One epoch of fixed-shape batches of this worker's share of `source`.

    Args:
      source: any `DataSource`; read once, front to back.
      batch_size: B, rows per batch.
      seed, epoch: seed the shuffle (non-negative ints).
      shuffle_buffer: examples in the shuffle buffer; 0 = file order.
      drop_remainder: drop the last partial batch instead of padding it.
      worker, num_workers: this worker's index and the number of workers.
      keep: optional predicate on example rows (see `holdout_split`).
      start: begin at this batch of the epoch: a seekable source (`recjax.data.seek`) reads
        none of the examples of batches ``< start``; another one is read from its start and
        the first `start` batches are dropped.

    Yields:
      (batch, n_valid): `Batch` of exactly `batch_size` rows, the first ``n_valid`` real.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker must be in [0, {num_workers}), got {worker}")
    if shuffle_buffer < 0 or seed < 0 or epoch < 0:
        raise ValueError(f"shuffle_buffer, seed and epoch must be >= 0, got "
                         f"{shuffle_buffer}, {seed}, {epoch}")
    if start:
        if not seek.seekable(source) or not drop_remainder:  # (a padded last batch: replay)
            return itertools.islice(batches(
                source, batch_size, seed=seed, epoch=epoch, shuffle_buffer=shuffle_buffer,
                drop_remainder=drop_remainder, worker=worker, num_workers=num_workers, keep=keep),
                start, None)
        pos = seek.locate(source, batch_size, seed=seed, epoch=epoch, batch=start,
                          shuffle_buffer=shuffle_buffer, worker=worker, num_workers=num_workers,
                          keep=keep)
        return seek.resume(source, pos, batch_size, shuffle_buffer=shuffle_buffer,
                           drop_remainder=drop_remainder, worker=worker,
                           num_workers=num_workers, keep=keep)
    stream = seek.select_stream(source, 0, worker, num_workers, keep)
    if shuffle_buffer:
        rng = np.random.default_rng([seed, epoch, worker])
        stream = shuffle(stream, shuffle_buffer, rng)
    return rebatch(stream, batch_size, drop_remainder=drop_remainder)


def first_batches(source, batch_size: int, n: int, *, seed: int, epoch: int,
                  shuffle_buffer: int, keep: Keep | None = None) -> list[Batch]:
    """The first `n` full batches of the epoch (`batches`' first n), reading only their
    examples when the source seeks (one `take_rows` for all: each row group read once)."""
    if not seek.seekable(source):
        return [b for b, _ in itertools.islice(batches(
            source, batch_size, seed=seed, epoch=epoch, shuffle_buffer=shuffle_buffer,
            drop_remainder=True, keep=keep), n)]
    positions = list(itertools.islice(seek.position_batches(
        source, batch_size, seed=seed, epoch=epoch, shuffle_buffer=shuffle_buffer, keep=keep), n))
    if not positions:
        return []
    rows = source.take_rows(np.concatenate(positions))
    return [to_batch(take(rows, slice(i * batch_size, (i + 1) * batch_size)))[0]
            for i in range(len(positions))]


def holdout_split(seed: int, fraction: float) -> tuple[Keep, Keep]:
    """(keep_train, keep_eval) predicates on example rows for a seeded random hold-out.

    A row goes to eval iff ``uniform01(seed, row) < fraction``: a stable hash, so the split is
    the same on every machine and worker, and the two sides are disjoint and cover every row.

    Args:
      seed: split seed (independent of the shuffle seed, so reshuffling never leaks eval rows).
      fraction: expected share of eval rows, in [0, 1].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"hold-out fraction must be in [0, 1], got {fraction}")

    def keep_eval(rows: np.ndarray) -> np.ndarray:
        return uniform01(seed, rows) < fraction

    def keep_train(rows: np.ndarray) -> np.ndarray:
        return ~keep_eval(rows)

    return keep_train, keep_eval


class CachedSource:
    """A source whose first complete pass is kept in memory and replayed afterwards.

    The cached arrays are made read-only, so a consumer that writes into a batch fails loudly
    instead of corrupting later epochs. A pass that stops early caches nothing; a source with
    more than ``max_rows`` examples is streamed every time (nothing is kept).

    Once cached, or when the wrapped source seeks, it seeks (`recjax.data.seek`): a pass
    from a stream position slices the kept chunks, and examples are taken by position.

    Attributes:
      name, spec: those of the wrapped source.
      stats: of the pass that filled the cache (or of the wrapped source's latest pass).
      rows_read: examples handed out of memory plus those the wrapped source read.
    """

    def __init__(self, source: DataSource, max_rows: int = 1_000_000):
        self.source = source
        self.name = source.name
        self.spec = source.spec
        self.max_rows = max_rows
        self._chunks: list[Chunk] | None = None
        self._stats: ReadStats | None = None
        self._handed = 0

    @property
    def rows_read(self) -> int:
        return self._handed + getattr(self.source, "rows_read", 0)

    def seekable(self) -> bool:
        return self._chunks is not None or seek.seekable(self.source)

    @property
    def random_access(self) -> bool:
        """Examples are read by position at no more cost than in a pass (held in memory)."""
        return self._chunks is not None

    def chunk_sizes(self) -> list[int]:
        if self._chunks is None:
            return self.source.chunk_sizes()
        return [c.size for c in self._chunks]

    def chunk_row_ids(self, c: int) -> np.ndarray:
        return self._chunks[c].row if self._chunks is not None else self.source.chunk_row_ids(c)

    def take_rows(self, positions: np.ndarray) -> Chunk:
        if self._chunks is None:
            return self.source.take_rows(positions)
        out = seek.gather(self.chunk_sizes(), self._chunks.__getitem__, positions)
        count_rows(self, out.size, "_handed")
        return out

    @property
    def stats(self) -> ReadStats:
        return self._stats if self._stats is not None else self.source.stats

    @property
    def is_cached(self) -> bool:
        return self._chunks is not None

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """A pass; from stream position `start` on when given (a seekable source's)."""
        if self._chunks is not None:
            for chunk in self._chunks:
                if start >= chunk.size:
                    start -= chunk.size
                    continue
                chunk = take(chunk, slice(start, None)) if start else chunk
                start = 0
                self._handed += chunk.size
                yield chunk
            return
        if start:  # part of a pass: streamed from the wrapped source, never cached
            yield from self.source.chunks(start)
            return
        kept: list[Chunk] | None = []
        rows = 0
        for chunk in self.source.chunks():
            rows += chunk.size
            if kept is not None and rows > self.max_rows:
                kept = None  # too big to cache: stream it every epoch
            if kept is not None:
                for a in chunk:
                    if a is not None:
                        a.flags.writeable = False
                kept.append(chunk)
            yield chunk
        err = all_skipped_error(getattr(self.source, "path", self.name), self.source.stats)
        if err is not None:
            raise err
        if kept is not None:
            self._chunks = kept
            self._stats = copy.deepcopy(self.source.stats)


def cached(source: DataSource, max_rows: int = 1_000_000) -> CachedSource:
    """Wrap `source` so that a source of at most `max_rows` examples is parsed only once."""
    return CachedSource(source, max_rows)
