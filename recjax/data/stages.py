"""The streaming stages of `recjax.data.pipeline.batches`: select, shuffle, batch.

They live apart from the pipeline so that `recjax.data.seek` (which replays the shuffle on
stream positions) and the pipeline (which seeks) both build on them without importing each
other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np

from recjax.batch import Batch, Chunk, concat_chunks, take, to_batch

Keep = Callable[[np.ndarray], np.ndarray]  # rows i64[N] -> bool[N]


def select(chunks: Iterable[Chunk], *, worker: int = 0, num_workers: int = 1,
           keep: Keep | None = None) -> Iterator[Chunk]:
    """The examples with ``row % num_workers == worker`` and ``keep(row)``, in order."""
    for chunk in chunks:
        mask = np.ones(chunk.size, bool) if num_workers == 1 else (
            chunk.row % num_workers == worker)
        if keep is not None:
            mask &= np.asarray(keep(chunk.row), bool)
        if mask.all():
            yield chunk
        elif mask.any():
            yield take(chunk, np.flatnonzero(mask))


def shuffle(chunks: Iterable[Chunk], buffer_size: int, rng: np.random.Generator
            ) -> Iterator[Chunk]:
    """Shuffle a stream through a buffer of `buffer_size` examples (see the module docstring)."""
    return Shuffle(buffer_size, rng).run(chunks)


class Rows:
    """How `Shuffle` handles its rows: chunks of examples (`CHUNKS`), or arrays of stream
    positions (`POSITIONS`, for `recjax.data.seek`, which replays the shuffle without data)."""

    def __init__(self, take, concat, copy, put, size):
        self.take, self.concat, self.copy, self.put, self.size = take, concat, copy, put, size


def _concat_positions(parts: list) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _put_positions(dst: np.ndarray, index: np.ndarray, src: np.ndarray) -> None:
    dst[index] = src


CHUNKS = Rows(take, concat_chunks, lambda c: copy_chunk(c), lambda d, i, s: _put(d, i, s),
              lambda c: c.size)
POSITIONS = Rows(lambda a, i: a[i], _concat_positions, np.array, _put_positions, len)


class Shuffle:
    """The shuffle buffer of the module docstring, with its state in the open so that a
    stream can stop and go on (`recjax.data.seek`).

    Attributes:
      buffer_size: S, examples in the buffer.
      rng: the Generator of the epoch (``(seed, epoch, worker)``).
      filling: rows taken in while the buffer was not yet full (empty once it is).
      buf: the full buffer (None until full).
      consumed: rows of the current input chunk taken in so far (read between outputs).
    """

    def __init__(self, buffer_size: int, rng: np.random.Generator, rows: Rows = CHUNKS,
                 buf=None):
        self.buffer_size, self.rng, self.rows = buffer_size, rng, rows
        self.filling: list = []  # until the buffer is full, so a small dataset costs little
        self.n_filling = 0
        self.buf = buf
        self.consumed = 0

    def run(self, chunks: Iterable) -> Iterator:
        """Every output of the stream `chunks`, then the rest of the buffer."""
        for chunk in chunks:
            yield from self.feed(chunk)
        rest = self.flush()
        if rest is not None:
            yield rest

    def feed(self, chunk) -> Iterator:
        """Take one input chunk in; yields the examples it evicts (one output per slice)."""
        r, size = self.rows, self.rows.size(chunk)
        start = 0
        if self.buf is None:
            start = min(self.buffer_size - self.n_filling, size)
            self.filling.append(r.take(chunk, slice(0, start)))
            self.n_filling += start
            if self.n_filling == self.buffer_size:
                self.buf = r.copy(r.concat(self.filling))
                self.filling = []
        self.consumed = start
        while start < size:  # buffer full: each new example evicts a random one
            m = min(size - start, self.buffer_size)
            slots = self.rng.choice(self.buffer_size, size=m, replace=False)
            out = r.take(self.buf, slots)  # fancy indexing copies
            r.put(self.buf, slots, r.take(chunk, slice(start, start + m)))
            start += m
            self.consumed = start
            yield out

    def flush(self):
        """The rest of the buffer in a random order (None when empty), once the input ends."""
        r = self.rows
        rest = self.buf if self.buf is not None else (r.concat(self.filling) if self.filling
                                                      else None)
        self.buf, self.filling, self.n_filling = None, [], 0
        if rest is not None and r.size(rest):
            return r.take(rest, self.rng.permutation(r.size(rest)))
        return None


def rebatch(chunks: Iterable[Chunk], batch_size: int, *, drop_remainder: bool
            ) -> Iterator[tuple[Batch, int]]:
    """Cut a stream of chunks into batches of exactly `batch_size` rows (padding the last)."""
    pending: list[Chunk] = []
    n = 0
    for chunk in chunks:
        pending.append(chunk)
        n += chunk.size
        if n < batch_size:
            continue
        joined = concat_chunks(pending)
        full = n - n % batch_size
        for start in range(0, full, batch_size):
            yield to_batch(take(joined, slice(start, start + batch_size)))
        pending = [take(joined, slice(full, n))] if full < n else []
        n -= full
    if n and not drop_remainder:
        yield to_batch(concat_chunks(pending), batch_size)


def copy_chunk(chunk: Chunk) -> Chunk:
    """A chunk with its own writable arrays (the shuffle buffer is written in place)."""
    return Chunk(*(None if a is None else np.array(a) for a in chunk))


def _put(dst: Chunk, index: np.ndarray, src: Chunk) -> None:
    for d, s in zip(dst, src):
        if d is not None:
            d[index] = s
