"""Batch supplies: how a run's examples reach the engine's workers (DESIGN.md section 4.2).

Two supplies, one interface: ``take(worker) -> (index, batch) | None`` (None: no data left for
that worker), safe to call from any role's thread, and ``close()``.

* `StaticShards` (ShadowSync, async PS): worker ``w`` of ``W`` reads the examples with
  ``row % W == w``, epoch after epoch; the workers share the run's steps (equal shares, the
  first ``remaining mod W`` workers one more). A slow worker's share waits for it.
* `SharedList` (GBA, Su et al. 2022 Sec. 4.1): one *data list* of Q batches cut from the run's
  example stream in order, batch i handed to whichever worker asks next, so fast workers take
  more batches. The example order is the single trainer's (seed, epoch) order, only cut into
  batches of ``B_a`` rows instead of ``B``: M = B / B_a consecutive entries hold exactly the
  examples of one global step of a `single` or `sync` run, which is what makes the sync <-> GBA
  hand-over through one checkpoint continue on the same data.

With the roles in the Ray actors (``ray_roles.py``) a worker's process reads its own batches:
`StaticShards` for that worker only, or GBA's list as `EntryIndex` (PS0's list of indices)
and `EntryReader` (entry i's batch read in the worker's process).

Batches come out *localized* for the embedding PS (`ps.localize`: ids remapped to the rows a
batch touches), prepared ahead on a `recjax.concurrency.Prefetcher` thread (inline in
deterministic runs). `Feed` is a run's data and cuts both supplies from it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from recjax.batch import to_batch
from recjax.concurrency import Prefetcher
from recjax.config import Config
from recjax.data.pipeline import batches, cached, first_batches
from recjax.data.seek import Counted, epoch_batches, position_batches, seekable
from recjax.data.shard_cache import ShardCache
from recjax.data.synthetic import SyntheticSource
from recjax.train.data import RunData, open_data, train_shuffle_buffer


def counted(data: RunData, reader: str) -> Counted:
    """The run's training source seen through the counter of `reader` (a worker, the data
    list, the placement's profile): one counter for the run, so the summary's rows read per
    reader cover every checkpoint interval of this process."""
    if reader not in data.readers:
        data.readers[reader] = Counted(data.train)
    return data.readers[reader]


class Feed:
    """A host-async run's training data, and the supplies its workers take batches from.

    Args:
      cfg: the run's config (``data``, ``train.seed``, ``train.deterministic``).
      batch_size: rows of one worker batch.
      cache: generate synthetic training data once and keep it (the workers read it here);
        False where only the first batches are read here (the workers read their shards in
        their own processes, ``ray_roles.py``).
      share: ``(worker, workers)``: keep only that worker's examples
        (`recjax.data.shard_cache.ShardCache`: a worker actor's own process reads no other).

    Attributes:
      data: the run's `RunData`.
      steps_per_epoch: global steps (``train.batch_size`` rows) in one pass over the data.
    """

    def __init__(self, cfg: Config, batch_size: int, cache: bool = True,
                 share: tuple[int, int] | None = None):
        self.cfg, self.batch_size = cfg, batch_size
        self.data = open_data(cfg)
        self.shuffle = train_shuffle_buffer(self.data, cfg.data.shuffle_buffer)
        if cache and isinstance(self.data.train, SyntheticSource):  # once, not once per worker
            if share is not None:
                self.data.train = ShardCache(self.data.train, *share, cfg.data.cache_rows)
                self.data.train.fill()
            else:
                self.data.train = cached(self.data.train, cfg.data.cache_rows)
                for _ in self.data.train.chunks():
                    pass
        self.steps_per_epoch = self.data.train_rows // cfg.train.batch_size
        self.depth = 0 if cfg.train.deterministic else cfg.data.prefetch  # batches made ahead

    def entries(self, index, m: int, localize: Callable[[Any], Any]) -> EntryReader:
        """GBA's data list read here by entry index (`EntryReader`), the indices from
        `index` (a shared server with `EntryIndex`'s ``next_entry``: PS0)."""
        return EntryReader(self.data, self.batch_size, self.steps_per_epoch * m,
                           self.cfg.train.seed, self.shuffle, index, localize)

    def first(self, n: int) -> list:
        """The first `n` (at least one) worker batches of the run's example order, as read
        (the PS placement's load profile, the batch every function is compiled on)."""
        source = counted(self.data, "profile")  # its reads
        return first_batches(source, self.batch_size, max(n, 1), seed=self.cfg.train.seed,
                             epoch=0, shuffle_buffer=self.shuffle, keep=self.data.keep_train)

    def static_shards(self, workers: int, start: int, end: int, periodic: bool,
                      localize: Callable[[Any], Any]) -> StaticShards:
        """Per-worker shards: the workers train the ``end - start`` steps between them (one
        batch each per step), so the run ends at exactly the requested step.

        A resumed run continues each worker's shard where it stopped: exact after a completed
        interval of equal shares; after a Ctrl-C, workers resume at their average position.
        """
        remaining, k = end - start, self.cfg.train.ckpt_every
        if periodic and k % workers:
            raise ValueError(f"--train.ckpt_every={k} must be a multiple of the {workers} "
                             f"workers (e.g. {k - k % workers or workers}): each interval gives "
                             "every worker the same number of batches, so its shard goes on "
                             "where it stopped")
        if 0 < remaining < workers:  # (0: a resume at the run's end only evaluates)
            raise ValueError(f"{remaining} steps cannot feed {workers} workers; raise --steps "
                             "or lower --trainers / --workers-per-trainer")
        return StaticShards(self.data, self.batch_size, self.cfg.train.seed, self.shuffle,
                            workers, start // workers, remaining, localize, self.depth)

    def shared_list(self, m: int, start: int, end: int,
                    localize: Callable[[Any], Any] | None) -> SharedList:
        """GBA's data list: M entries of ``B_a`` rows per global step, steps ``[start, end)``."""
        return SharedList(self.data, self.batch_size, self.steps_per_epoch * m,
                          self.cfg.train.seed, self.shuffle, start * m, end * m, localize,
                          self.depth)


class StaticShards:
    """Per-worker shards of the data (``row % W``), ``quota`` batches in all after ``skip``.

    Args:
      data: the run's data.
      batch_size: rows per batch.
      seed: the data-order seed (train.seed).
      buffer: shuffle buffer (`recjax.train.data.train_shuffle_buffer`).
      num_workers: W.
      skip: batches of its shard each worker consumed before the checkpoint this run resumes.
      quota: batches the workers train on in this run, together: worker w takes
        ``quota // W``, plus one when ``w < quota % W``, so the run ends at exactly the
        requested step.
      transform: applied to each batch in the prefetch thread (`ps.localize`).
      depth: prefetch depth (0 = inline: deterministic runs).
    """

    def __init__(self, data: RunData, batch_size: int, seed: int, buffer: int, num_workers: int,
                 skip: int, quota: int, transform: Callable[[Any], Any], depth: int):
        self.data, self.batch_size, self.seed, self.buffer = data, batch_size, seed, buffer
        self.num_workers, self.skip, self.quota = num_workers, skip, quota
        self._transform, self._depth = transform, depth
        self._streams: dict[int, Prefetcher] = {}
        self._taken = [0] * num_workers

    shares = True  # worker w reads only its own examples

    def actor_spec(self) -> tuple:
        """How a worker's own process makes its part of this supply (``ray_roles.py``)."""
        return "shards", self.num_workers, self.skip, self.quota

    def _gen(self, wid: int) -> Iterator:
        source = counted(self.data, f"worker {wid}")  # its reads
        epoch, skip = 0, self.skip
        if skip:  # the batches consumed before the checkpoint are not read (recjax.data.seek)
            per_epoch = epoch_batches(source, self.batch_size, worker=wid,
                                      num_workers=self.num_workers, keep=self.data.keep_train)
            epoch, skip = divmod(skip, max(per_epoch, 1))
        while True:
            got = False
            for batch, _ in batches(source, self.batch_size, seed=self.seed, epoch=epoch,
                                    shuffle_buffer=self.buffer, drop_remainder=True, worker=wid,
                                    num_workers=self.num_workers, keep=self.data.keep_train,
                                    start=skip):
                got = True
                yield batch
            if not got and not skip:
                raise ValueError(f"worker {wid} of {self.num_workers} gets less than one batch "
                                 f"of {self.batch_size} per epoch; lower --batch-size")
            epoch, skip = epoch + 1, 0

    def share(self, wid: int) -> int:
        """Batches worker `wid` takes in this run."""
        return self.quota // self.num_workers + (wid < self.quota % self.num_workers)

    def take(self, wid: int) -> tuple[int, Any] | None:
        """Worker `wid`'s next ``(index within its shard, localized batch)``, or None."""
        if self._taken[wid] >= self.share(wid):
            return None
        if wid not in self._streams:  # only this worker's role touches its stream
            self._streams[wid] = Prefetcher(self._gen(wid), depth=self._depth,
                                            transform=self._transform,
                                            name=f"recjax-prefetch-w{wid}")
        i = self.skip + self._taken[wid]
        self._taken[wid] += 1
        return i, next(self._streams[wid])

    def close(self) -> None:
        for s in self._streams.values():
            s.close()


class SharedList:
    """GBA's data list: entries ``[start, stop)`` of one batch stream, to whoever asks first.

    Entry i is batch ``i mod per_epoch`` of epoch ``i // per_epoch`` of the run's example order
    (`batches` with the train seed), cut into batches of `batch_size` rows.

    Args:
      data: the run's data.
      batch_size: B_a, rows per entry.
      per_epoch: entries per epoch (steps per epoch x M, so epochs align with the global batch).
      seed: the data-order seed (train.seed).
      buffer: shuffle buffer (`recjax.train.data.train_shuffle_buffer`).
      start, stop: the entries of this run (a resumed run starts where the checkpoint stopped).
      transform: applied to each batch in the prefetch thread (`ps.localize`).
      depth: prefetch depth (0 = inline: deterministic runs).
    """

    def __init__(self, data: RunData, batch_size: int, per_epoch: int, seed: int, buffer: int,
                 start: int, stop: int, transform: Callable[[Any], Any], depth: int):
        if per_epoch < 1:
            raise ValueError(f"the training data holds less than one global batch of "
                             f"{batch_size} x M rows; lower --batch-size")
        self.data, self.batch_size, self.per_epoch = data, batch_size, per_epoch
        self.seed, self.buffer, self.start, self.stop = seed, buffer, start, stop
        self._next = start
        self._lock = threading.Lock()
        self._stream = Prefetcher(self._gen(), depth=depth, transform=transform,
                                  name="recjax-prefetch-list")

    def _gen(self) -> Iterator:
        source = counted(self.data, "data list")  # its reads
        i = self.start
        while i < self.stop:
            epoch, skip = divmod(i, self.per_epoch)
            before = i
            for pos, (batch, _) in enumerate(batches(  # from entry `skip` on, seeking
                    source, self.batch_size, seed=self.seed, epoch=epoch,
                    shuffle_buffer=self.buffer, drop_remainder=True, keep=self.data.keep_train,
                    start=skip), start=skip):
                if pos >= self.per_epoch or i >= self.stop:
                    break
                yield batch
                i += 1
            if i == before:  # the epoch ran out before entry i: never loop on an empty pass
                raise ValueError(f"epoch {epoch} of the training data holds fewer than "
                                 f"{skip + 1} batches of {self.batch_size} rows; lower "
                                 "--batch-size or --gba.local_batch_size")

    shares = False  # any worker may take any entry

    @property
    def handed_out(self) -> int:
        """Entries handed out so far in this run."""
        return self._next - self.start

    def take(self, wid: int = 0) -> tuple[int, Any] | None:
        """The next ``(entry index, localized batch)``, or None when the list is exhausted."""
        with self._lock:
            if self._next >= self.stop:
                return None
            i = self._next
            self._next += 1
            return i, next(self._stream)

    def close(self) -> None:
        self._stream.close()


class EntryIndex:
    """GBA's data list as indices only, ``[start, stop)`` to whoever asks first: PS0's list
    (Su et al. 2022 App. B Alg. 2 hands out the entries and their tokens; `gba.GbaServer`
    holds one) with the roles in the Ray actors; each worker's process reads the entries it
    gets itself (`EntryReader`). The same entries `SharedList` hands out."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop, self._next = start, stop, start
        self._lock = threading.Lock()

    def next_entry(self) -> int | None:
        """The next entry's index, or None when the list is exhausted."""
        with self._lock:
            if self._next >= self.stop:
                return None
            self._next += 1
            return self._next - 1

    def handed_out(self) -> int:
        return self._next - self.start


class ListOfIndices:
    """The driver's side of GBA's list with the roles in the actors: the shared server with
    `EntryIndex`'s ``next_entry`` (`index`: GBA's PS0, Persia's pipeline) the worker actors take
    from, `localize`: whether they localize each entry as they read it; nothing is read
    here."""

    shares = False

    def __init__(self, index, m: int, localize: bool = True):
        self.index, self.m, self.localize = index, m, localize

    def actor_spec(self) -> tuple:
        return "list", self.index, self.m, self.localize

    def take(self, wid: int = 0):
        raise RuntimeError("GBA's list with the roles in the actors is read by the workers' "
                           "processes (EntryReader), not here")

    def close(self) -> None:
        pass


class EntryReader:
    """Entries of GBA's data list read in a worker's own process, by index (`EntryIndex`): entry
    i is batch ``i mod per_epoch`` of epoch ``i // per_epoch``, as `SharedList` cuts it. A
    worker's entries come in increasing order; from a source that seeks (`seekable`: in memory,
    or a Parquet dataset) the batches between them are computed as positions only
    (`position_batches`) and entry i's examples read by position, so a worker reads its own
    entries' examples, not the whole list's; another source is read through the entries
    between. Not prefetched: the next entry is known only when the worker asks for it.

    Args:
      data, batch_size, per_epoch, seed, buffer: as `SharedList`'s.
      index: a shared server with `EntryIndex`'s ``next_entry`` (GBA's PS0).
      transform: applied to each batch (`ps.localize`).
    """

    shares = False

    def __init__(self, data: RunData, batch_size: int, per_epoch: int, seed: int, buffer: int,
                 index, transform: Callable[[Any], Any]):
        if per_epoch < 1:
            raise ValueError(f"the training data holds less than one global batch of "
                             f"{batch_size} x M rows; lower --batch-size")
        self.data, self.batch_size, self.per_epoch = data, batch_size, per_epoch
        self.seed, self.buffer, self.index, self._transform = seed, buffer, index, transform
        self._epoch, self._pos, self._stream = -1, 0, iter(())
        self._source: Counted | None = None
        self._seeks = False  # (the source's: whether entries are read by position)

    def take(self, wid: int = 0) -> tuple[int, Any] | None:
        """The next entry ``(index, localized batch)`` of the list, or None when it is done."""
        i = self.index.next_entry()
        if i is None:
            return None
        if self._source is None:
            self._source = counted(self.data, f"worker {wid}")  # its reads
            self._seeks = seekable(self._source)
        return i, self._transform(self._batch(i))

    def _batch(self, i: int):
        src = self._source
        epoch, pos = divmod(i, self.per_epoch)
        order = dict(seed=self.seed, epoch=epoch, shuffle_buffer=self.buffer,
                     keep=self.data.keep_train)
        if epoch != self._epoch or pos < self._pos:  # a new epoch (or a resumed list)
            self._epoch, self._pos = epoch, 0
            self._stream = (position_batches(src, self.batch_size, **order) if self._seeks
                            else (b for b, _ in batches(src, self.batch_size,
                                                        drop_remainder=True, **order)))
        for _ in range(pos - self._pos):  # other workers' entries: positions only, if it seeks
            next(self._stream, None)
        got, self._pos = next(self._stream, None), pos + 1
        if got is None:
            raise ValueError(f"epoch {epoch} of the training data holds fewer than {pos + 1} "
                             f"batches of {self.batch_size} rows; lower --batch-size or "
                             "--gba.local_batch_size")
        return to_batch(src.take_rows(got))[0] if self._seeks else got

    def close(self) -> None:
        pass
