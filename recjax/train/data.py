"""Open a run's training and eval data from its config."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Iterator

import numpy as np

from recjax.batch import Batch, take, to_batch
from recjax.config import Config
from recjax.data.arrays import ArraySource
from recjax.data.base import DataSource
from recjax.data.columnar import ParquetSource
from recjax.data.days import TimeWindows, days_of, has_days
from recjax.data.diskcache import DiskCachedSource
from recjax.data.pipeline import CachedSource, cached, holdout_split
from recjax.data.seek import epoch_rows, position_batches, seekable
from recjax.data.sources import open_source
from recjax.data.synthetic import SyntheticSource, synthetic_name
from recjax.features import FeatureSpec

Keep = Callable[[np.ndarray], np.ndarray] | None


@dataclasses.dataclass
class RunData:
    """Attributes:
      train, eval: sources (the same object when eval is a hold-out split of train).
      keep_train, keep_eval: row predicates selecting each split (None = every row).
      eval_desc: what the eval set is, for logs and summary.json.
      train_rows, eval_rows: examples in each split.
      readers: the host-async supplies' views of `train`, by name (``worker 0``, ...,
        ``data list``), each counting the examples read through it (`rows_read`).
    """

    train: DataSource
    eval: DataSource
    keep_train: Keep
    keep_eval: Keep
    eval_desc: str
    train_rows: int
    eval_rows: int
    readers: dict = dataclasses.field(default_factory=dict)

    @property
    def spec(self) -> FeatureSpec:
        return self.train.spec


def rows_read(data: RunData) -> dict:
    """Examples the run's sources read (decoded, generated or handed out of memory; a text
    sample's parse at open is not counted), for summary.json: ``train``, ``eval`` (the same
    number when eval is a hold-out of train: one source) and, in host-async runs, per reader."""
    out = {"train": getattr(data.train, "rows_read", None),
           "eval": getattr(data.eval, "rows_read", None)}
    if data.readers:
        out["by_reader"] = {name: view.rows for name, view in data.readers.items()}
    return out


def process_rows(strategy, batch_size: int) -> slice | None:
    """The rows of every global batch this process's devices hold, in a multi-process SPMD run
    (the batch is split on the mesh's ``data`` axis, `sharding.spmd.batch_specs`); None in a
    single process or for a strategy without a mesh."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = getattr(strategy, "mesh", None)
    if jax.process_count() == 1 or mesh is None:
        return None
    index = NamedSharding(mesh, PartitionSpec("data")).addressable_devices_indices_map(
        (batch_size,))
    spans = [ix[0].indices(batch_size)[:2] for ix in index.values()]
    return slice(min(a for a, _ in spans), max(b for _, b in spans))


def block_batches(source, batch_size: int, rows: slice, *, start: int = 0,
                  **order) -> Iterator[Batch]:
    """Batches of `batch_size` rows of which only ``rows`` hold examples, read by position
    (`recjax.data.seek.position_batches`): this process's block of each global batch, the
    other rows zero (`sharding.arrays.put` hands each process's devices its block only).

    A source read from disk (not held in memory) is read for ``ceil(shuffle_buffer /
    batch_size)`` batches at once: with a shuffle, one batch's rows lie all over the buffer's
    window, and reading batch by batch decoded every row group of the window per batch (75x
    the rows delivered with a buffer of 32 row groups); read together, each row group is
    decoded about twice (docs/data.md).

    Args:
      start: the first batch of the epoch; `order`: `batches`' seed, epoch, shuffle_buffer,
        keep (the global order, so the blocks of all processes make the global batches).
    """
    buffer = order.get("shuffle_buffer", 0)
    ahead = 1 if getattr(source, "random_access", False) or not buffer else -(-buffer // batch_size)
    todo = itertools.islice(position_batches(source, batch_size, **order), start, None)
    n = len(range(batch_size)[rows])
    while group := list(itertools.islice(todo, ahead)):
        got = source.take_rows(np.concatenate([p[rows] for p in group]))
        for i in range(len(group)):
            block, _ = to_batch(take(got, slice(i * n, (i + 1) * n)))
            full = Batch(*(None if a is None else np.zeros((batch_size, *a.shape[1:]), a.dtype)
                           for a in block))
            for a, b in zip(full, block):
                if a is not None:
                    a[rows] = b
            yield full


def train_shuffle_buffer(data: RunData, configured: int) -> int:
    """The shuffle buffer for training batches: synthetic examples are i.i.d. draws already,
    so shuffling them would only cost time; a time-ordered view (`TimeWindows`) is shuffled
    within its windows already."""
    return 0 if isinstance(data.train, SyntheticSource | TimeWindows) else configured


def _count(source: DataSource, keep: Keep) -> int:
    """Examples of `source` that `keep` selects: by a pass when the pass fills the in-memory
    cache (a text file, a Parquet dataset of at most ``data.cache_rows``; host-async workers
    then share memory instead of each reading the file), else from chunk sizes and row ids (a
    larger Parquet dataset: its manifest and ``row`` column, no pass)."""
    if seekable(source) and not (isinstance(source, CachedSource) and not source.is_cached
                                 and sum(source.chunk_sizes()) <= source.max_rows):
        return epoch_rows(source, keep=keep)  # in memory already, or too large for it
    n = 0
    for chunk in source.chunks():
        n += chunk.size if keep is None else int(np.count_nonzero(keep(chunk.row)))
    return n


def data_workers(cfg: Config) -> int:
    """``data.workers``, with 0 = half the host's cores, at most 8."""
    return cfg.data.workers or max(1, min(8, (os.cpu_count() or 2) // 2))


def _open(cfg: Config, spec: str, split: str = "train") -> DataSource:
    name = synthetic_name(spec)
    if name is not None:
        if name != cfg.synthetic.name:
            # The preset is chosen by the spec; the `synthetic` section holds its (overridable)
            # values. A mismatch means they were set apart (e.g. --data.train=synthetic:X).
            raise ValueError(f"data spec {spec!r} names synthetic preset {name!r} but the synthetic "
                             f"config section holds {cfg.synthetic.name!r}; pass --data {spec} "
                             "(which loads the preset) or set --synthetic.name to match")
        return SyntheticSource(cfg.synthetic, split, workers=data_workers(cfg))
    # An lru store keys its rows by raw 64-bit ids (no modulo hashing); in the options, so the
    # disk cache keys on it too. (Synthetic ids are exact already; they stay i32 either way.)
    options = {"hash_buckets": cfg.data.hash_buckets, "skip_bad_lines": cfg.data.skip_bad_lines,
               "multi_hot_len": cfg.data.multi_hot_len, "raw_ids": cfg.embed.store == "lru"}
    source = open_source(spec, **options)
    if isinstance(source, ParquetSource):  # row groups decoded ahead, as synthetic chunks are
        source.workers = data_workers(cfg)
    # arrays: in memory already; parquet: converted once already, read by row group
    if cfg.data.cache_dir and not isinstance(source, ArraySource | ParquetSource):
        source = DiskCachedSource(source, cfg.data.cache_dir, options)
    return cached(source, cfg.data.cache_rows)


def open_data(cfg: Config) -> RunData:
    """Training data and its eval set: ``data.eval`` if given, else a seeded hold-out split.

    Synthetic data evaluates on its own eval stream (fresh examples of the same teacher).
    """
    train = _open(cfg, cfg.data.train)
    if cfg.data.eval:
        ev = _open(cfg, cfg.data.eval, "eval")  # synthetic: the eval stream, never train rows
        if ev.spec != train.spec:
            raise ValueError(f"eval data {cfg.data.eval!r} has another schema than training data "
                             f"{cfg.data.train!r}; use the same format and --data.hash_buckets")
        keep_train = keep_eval = None
        desc = cfg.data.eval
    elif isinstance(train, SyntheticSource):
        ev = SyntheticSource(cfg.synthetic, "eval", workers=data_workers(cfg))
        keep_train = keep_eval = None
        desc = f"synthetic:{cfg.synthetic.name} eval stream ({cfg.synthetic.n_eval} fresh examples)"
    else:
        ev = train
        keep_train, keep_eval = holdout_split(cfg.data.split_seed, cfg.data.holdout)
        desc = (f"seeded hold-out split of {cfg.data.train}: {cfg.data.holdout:.0%} of rows "
                f"(split seed {cfg.data.split_seed})")
    if cfg.data.order == "time" or cfg.data.eval_day >= 0:
        train, keep_eval, desc = _in_time_order(cfg, train, keep_eval, desc)
    train_rows = train.num_rows if isinstance(train, SyntheticSource) else _count(train, keep_train)
    eval_rows = ev.num_rows if isinstance(ev, SyntheticSource) else _count(ev, keep_eval)
    if train_rows < cfg.train.batch_size:
        raise ValueError(f"{cfg.data.train}: {train_rows} training examples, fewer than one batch "
                         f"of {cfg.train.batch_size}; lower --batch-size")
    if eval_rows == 0:
        raise ValueError(f"eval set {desc} is empty")
    return RunData(train, ev, keep_train, keep_eval, desc, train_rows, eval_rows)


def _in_time_order(cfg: Config, train: DataSource, keep_eval: Keep, desc: str):
    """``data.order=time`` and ``data.eval_day`` (`recjax.data.days`): the training source in
    time order (a Parquet dataset's days, each shuffled within windows of
    ``data.shuffle_buffer`` examples; synthetic data is in time order already), and the
    hold-out rows of day ``eval_day`` as the eval set."""
    if isinstance(train, SyntheticSource):
        if cfg.data.eval_day >= 0:
            raise ValueError("data.eval_day: synthetic data evaluates on its own eval stream; "
                             "use --synthetic.eval_day")
        return train, keep_eval, desc
    if not has_days(train):
        raise ValueError(f"{cfg.data.train}: data.order=time and data.eval_day need data with "
                         "days: synthetic data with --synthetic.days, or a Parquet dataset "
                         "converted from one input per day (scripts/convert.py)")
    if cfg.data.eval_day >= 0:
        if cfg.data.eval:
            raise ValueError("data.eval_day evaluates on a day of the training data's hold-out "
                             f"split; drop --eval-data {cfg.data.eval} or data.eval_day")
        held, day = keep_eval, cfg.data.eval_day
        keep_eval = lambda rows: held(rows) & (days_of(train, rows) == day)  # noqa: E731
        desc = f"day {day} of the {desc}"
    if cfg.data.order == "time" and cfg.data.shuffle_buffer:
        if (isinstance(train, CachedSource) and not train.is_cached
                and sum(train.chunk_sizes()) <= train.max_rows):
            for _ in train.chunks():  # one pass fills the memory cache the windows read from
                pass
        train = TimeWindows(train, cfg.data.shuffle_buffer, cfg.train.seed)
    return train, keep_eval, desc
