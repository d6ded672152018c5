"""Resume an epoch's batch stream mid-way without reading the examples it has already used.

The batches of an epoch are a pure function of the source and ``(seed, epoch, worker)``
(`recjax.data.pipeline.batches`): select, shuffle through a buffer, cut into batches. Where that
stream stands after ``k`` batches, its `Position`, is

* ``cursor``: the stream position (0-based index in the source's pass) of the first example the
  shuffle has not taken in yet, i.e. (file, row group, offset) in a Parquet dataset;
* ``buffer``: the positions of the examples in the shuffle buffer, and the buffer's Generator
  state (``rng``); ``done`` once the input has ended and the buffer was emitted;
* ``pending``: positions the shuffle has emitted that no batch holds yet.

`locate` computes it without reading any example: it runs the shuffle on stream *positions*
(`recjax.data.pipeline.POSITIONS`; the Generator draws depend only on how many rows arrive, and
those are known from the source's chunk sizes and, for a worker share or a hold-out split, its
row ids). `resume` then reads the pending and buffered examples by position and the rest of the
pass from the cursor on, and gives exactly the batches ``k, k + 1, ...`` of the uninterrupted
stream. Examples already in batches ``< k`` are never read (a Parquet dataset decodes the row
group the cursor is in from its start; an in-memory source slices).

This is Grain's iterator state (``(row group, index within it)`` plus the shuffle's; Grain's
window shuffle keeps its window in the state) with the window not stored: a checkpoint's
buffer of ``2^21`` examples would be hundreds of MB, its positions are recomputed in
milliseconds per chunk instead.

A source can seek when it has (`seekable`):

* ``chunk_sizes() -> list[int]``: the sizes of the chunks of a pass, in order;
* ``chunk_row_ids(c) -> i64[n]``: the ``row`` of chunk ``c``'s examples (their ids, not their
  data: in memory already, or one column of a Parquet dataset);
* ``chunks(start)``: a pass from stream position ``start`` on, cut where a whole pass is cut;
* ``take_rows(positions) -> Chunk``: the examples at these positions, in this order;
* ``rows_read``: examples read (decoded, generated or handed out of memory) so far.

A source that holds its examples in memory (``random_access``) is also read by position when
a worker's share or a hold-out split keeps only some of them (`selected`): a worker reads its
own examples, not the whole pass.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator

import numpy as np

from recjax.batch import Batch, Chunk, concat_chunks, take
from recjax.data.stages import POSITIONS, Shuffle, copy_chunk, rebatch, select

Keep = Callable[[np.ndarray], np.ndarray]


def seekable(source) -> bool:
    """Whether `source` can start a pass mid-way (the module docstring)."""
    check = getattr(source, "seekable", None)
    return bool(check()) if callable(check) else False


@dataclasses.dataclass
class Position:
    """Where an epoch's batch stream stands after `batch` batches (the module docstring).

    Attributes:
      epoch, batch: the epoch and the batches of it already handed out.
      cursor: stream position of the first example the shuffle has not taken in.
      pending: i64 positions emitted by the shuffle and not yet in a batch, in order.
      buffer: i64 positions in the shuffle buffer, slot by slot (None: no buffer, or done).
      rng: the shuffle Generator's bit-generator state (None without a shuffle).
      done: the input has ended and the buffer was emitted.
    """

    epoch: int
    batch: int
    cursor: int
    pending: np.ndarray
    buffer: np.ndarray | None
    rng: dict | None
    done: bool

    def summary(self) -> dict:
        """A JSON-able description (positions counted, not listed)."""
        return {"epoch": self.epoch, "batch": self.batch, "cursor": self.cursor,
                "pending": int(self.pending.size),
                "buffered": 0 if self.buffer is None else int(self.buffer.size),
                "done": self.done}


def _kept(source, c: int, start: int, size: int, worker: int, num_workers: int,
          keep: Keep | None) -> np.ndarray:
    """Stream positions of chunk `c` that `select` keeps."""
    if num_workers == 1 and keep is None:
        return np.arange(start, start + size, dtype=np.int64)
    rows = source.chunk_row_ids(c)
    mask = np.ones(size, bool) if num_workers == 1 else (rows % num_workers == worker)
    if keep is not None:
        mask &= np.asarray(keep(rows), bool)
    return start + np.flatnonzero(mask).astype(np.int64)


def selected(source, start: int = 0, *, worker: int = 0, num_workers: int = 1,
             keep: Keep | None = None) -> Iterator[Chunk]:
    """What `select` yields from ``source.chunks(start)``, read by position: only the kept
    examples are read (for a source held in memory, ``random_access``: a worker's share or a
    hold-out split reads its own examples, not the whole pass)."""
    first = 0
    for c, size in enumerate(source.chunk_sizes()):
        if first + size > start:
            kept = _kept(source, c, first, size, worker, num_workers, keep)
            kept = kept[kept >= start] if start > first else kept
            if kept.size:
                yield source.take_rows(kept)
        first += size


def select_stream(source, start: int, worker: int, num_workers: int, keep: Keep | None
                  ) -> Iterator[Chunk]:
    """`select` over a pass from `start`: by position (`selected`) when the source holds its
    examples in memory and some are dropped, else over its chunks."""
    if getattr(source, "random_access", False) and (num_workers > 1 or keep is not None):
        return selected(source, start, worker=worker, num_workers=num_workers, keep=keep)
    return select(source.chunks(start) if start else source.chunks(), worker=worker,
                  num_workers=num_workers, keep=keep)


def epoch_rows(source, *, worker: int = 0, num_workers: int = 1,
               keep: Keep | None = None) -> int:
    """Examples of one pass that `select` keeps, from chunk sizes and row ids (no data read)."""
    n, start = 0, 0
    for c, size in enumerate(source.chunk_sizes()):
        n += _kept(source, c, start, size, worker, num_workers, keep).size
        start += size
    return n


def locate(source, batch_size: int, *, seed: int, epoch: int, shuffle_buffer: int, batch: int,
           worker: int = 0, num_workers: int = 1, keep: Keep | None = None) -> Position:
    """The `Position` of epoch `epoch`'s stream after `batch` batches, read from no example
    (an epoch of fewer batches ends there: nothing is pending)."""
    target = batch * batch_size  # rows handed out in batches before the position
    shuf = (Shuffle(shuffle_buffer, np.random.default_rng([seed, epoch, worker]), POSITIONS)
            if shuffle_buffer else None)
    emitted, tail = 0, []  # rows emitted so far; the outputs not wholly before `target`

    def reached(out: np.ndarray) -> bool:
        nonlocal emitted
        emitted += out.size
        if emitted > target:
            tail.append(out)
        return emitted >= target

    def position(cursor: int, done: bool) -> Position:
        rest = np.concatenate(tail) if tail else np.zeros(0, np.int64)
        pending = rest[rest.size - (emitted - target):]
        buf = None if shuf is None or shuf.buf is None or done else shuf.buf.copy()
        rng = None if shuf is None or done else shuf.rng.bit_generator.state
        return Position(epoch, batch, cursor, pending, buf, rng, done)

    start = 0
    for c, size in enumerate(source.chunk_sizes()):
        kept = _kept(source, c, start, size, worker, num_workers, keep)
        start += size
        if not kept.size:
            continue  # select yields nothing for it
        if shuf is None:  # file order: the selected chunk goes on as it is
            if reached(kept):  # the pending rows are the selected ones from the first on
                pos = position(start, False)
                if pos.pending.size:
                    pos.cursor, pos.pending = int(pos.pending[0]), pos.pending[:0]
                return pos
            continue
        for out in shuf.feed(kept):
            if reached(out):
                cursor = start if shuf.consumed == kept.size else int(kept[shuf.consumed])
                return position(cursor, False)
    rest = shuf.flush() if shuf is not None else None
    if rest is not None and reached(rest):
        return position(start, True)
    # the epoch ends before: nothing is left (as a replay that drops `batch` batches)
    return Position(epoch, batch, start, np.zeros(0, np.int64), None, None, True)


def resume(source, pos: Position, batch_size: int, *, shuffle_buffer: int, drop_remainder: bool,
           worker: int = 0, num_workers: int = 1, keep: Keep | None = None
           ) -> Iterator[tuple[Batch, int]]:
    """Batches ``pos.batch, pos.batch + 1, ...`` of the epoch, reading only what they need."""
    head = [source.take_rows(pos.pending)] if pos.pending.size else []
    if pos.done:
        return rebatch(iter(head), batch_size, drop_remainder=drop_remainder)
    stream = select_stream(source, pos.cursor, worker, num_workers, keep)
    if shuffle_buffer:
        rng = np.random.default_rng()
        rng.bit_generator.state = pos.rng
        buf = copy_chunk(source.take_rows(pos.buffer))
        stream = Shuffle(shuffle_buffer, rng, buf=buf).run(stream)
    return rebatch(itertools.chain(head, stream), batch_size, drop_remainder=drop_remainder)


def gather(sizes: list[int], read: Callable[[int], Chunk], positions: np.ndarray) -> Chunk:
    """The examples at stream `positions` (in that order) of a pass made of units of `sizes`
    rows (chunks, row groups), each unit read once by ``read(unit)``."""
    positions = np.asarray(positions, np.int64)
    if positions.ndim != 1 or not positions.size:
        raise ValueError("take_rows needs a non-empty 1-D array of stream positions")
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    if positions.min() < 0 or positions.max() >= starts[-1]:
        raise IndexError(f"stream positions outside [0, {starts[-1]})")
    unit = np.searchsorted(starts, positions, side="right") - 1
    order = np.argsort(unit, kind="stable")
    parts, by_unit = [], unit[order]
    bounds = np.flatnonzero(np.diff(by_unit)) + 1
    for idx in np.split(order, bounds):
        u = int(unit[idx[0]])
        parts.append(take(read(u), positions[idx] - starts[u]))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return take(concat_chunks(parts), inverse)


def epoch_batches(source, batch_size: int, *, worker: int = 0, num_workers: int = 1,
                  keep: Keep | None = None) -> int:
    """Full batches of this worker's share in one pass: from row ids when the source seeks,
    else by reading a pass."""
    if seekable(source):
        n = epoch_rows(source, worker=worker, num_workers=num_workers, keep=keep)
    else:
        n = sum(c.size for c in select(source.chunks(), worker=worker, num_workers=num_workers,
                                       keep=keep))
    return n // batch_size


class Counted:
    """A source seen through a counter: ``rows`` examples read through this view (one
    worker's reads of a source shared by several; everything else is the source's own)."""

    def __init__(self, source):
        self.source, self.rows = source, 0

    def __getattr__(self, name: str):
        if name == "source":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.source, name)

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        for chunk in self.source.chunks(start) if start else self.source.chunks():
            self.rows += chunk.size
            yield chunk

    def take_rows(self, positions: np.ndarray) -> Chunk:
        out = self.source.take_rows(positions)
        self.rows += out.size
        return out


def position_batches(source, batch_size: int, *, seed: int, epoch: int, shuffle_buffer: int,
                     worker: int = 0, num_workers: int = 1, keep: Keep | None = None
                     ) -> Iterator[np.ndarray]:
    """The stream positions of each full batch of the epoch (`batches` with drop_remainder,
    on positions: no example read), for a reader that reads only a block of every batch."""
    shuf = (Shuffle(shuffle_buffer, np.random.default_rng([seed, epoch, worker]), POSITIONS)
            if shuffle_buffer else None)

    def outputs() -> Iterator[np.ndarray]:
        start = 0
        for c, size in enumerate(source.chunk_sizes()):
            kept = _kept(source, c, start, size, worker, num_workers, keep)
            start += size
            if kept.size:
                yield from (shuf.feed(kept) if shuf is not None else (kept,))
        rest = shuf.flush() if shuf is not None else None
        if rest is not None:
            yield rest

    pending = np.zeros(0, np.int64)
    for out in outputs():
        pending = np.concatenate([pending, out])
        full = pending.size - pending.size % batch_size
        for lo in range(0, full, batch_size):
            yield pending[lo:lo + batch_size]
        pending = pending[full:]
