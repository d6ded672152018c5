"""Run configuration: frozen dataclass sections, named configs, and `--section.field=value`.

A `Config` holds one frozen dataclass per section (``data``, ``synthetic``, ``model``, ``embed``,
``dense``, ``sparse``, ``train``, ``spmd``, the host-async sections defined in
`recjax.config_async`: the engine's ``runtime``, ``ray``, and each host-async algorithm's own
``shadowsync``, ``gba``, ``persia``; and ``diloco``). Overrides are type-checked against the
field's annotation and unknown keys are refused with the closest valid names (nanoGPT's
configurator, made strict).
A field's declaration says the rest (`recjax.config_fields`): a ``Literal`` annotation is its
closed set of values (checked, listed by ``--help-config``), ``metadata=RESUMABLE`` lets a
``--resume`` change it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import field
from typing import Literal

from recjax import registry
from recjax.config_async import (
    GbaConfig,
    PersiaConfig,
    RayConfig,
    RuntimeConfig,
    ShadowSyncConfig,
)
from recjax.config_fields import RESUMABLE, check_choices, is_text
from recjax.data.synthetic import SyntheticConfig
from recjax.embeddings.sparse_optim import SparseOptimConfig
from recjax.features import POOLINGS
from recjax.models.config import ModelConfig
from recjax.train.features import (
    MONITOR_NAMES,
    SCHEDULES,
    check_early_stop,
    check_schedule,
    parse_dims,
)

SEED_MAX = 2**63 - 1  # seeds reach numpy / jax as int64


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where examples come from and how they are batched.

    Attributes:
      train: training data SPEC (``criteo:PATH``, ``frappe:PATH``, ``synthetic[:NAME]``, ...).
      eval: eval data SPEC; empty = a seeded hold-out split of the training data.
      holdout: fraction of the training data held out for eval when ``eval`` is empty.
      split_seed: seed of the hold-out split; separate from train.seed so that a seed sweep
        evaluates every seed on the same examples.
      hash_buckets: hash buckets per hashed categorical field.
      multi_hot_len: ids kept per multi-hot field (L); longer lists are truncated and counted.
      skip_bad_lines: skip and count malformed lines instead of stopping at the first.
      shuffle_buffer: examples per shuffle buffer; 0 keeps file order; >= data size = full shuffle.
      cache_rows: parse a source at most once per run if it has at most this many rows.
      cache_dir: parse each data file once into .npy files here and memory-map them in later
        epochs and later runs (keyed by file size/mtime and reader options); empty = off.
      prefetch: batches prepared ahead by the background thread (0 = no thread).
      workers: threads generating synthetic chunks, or decoding a Parquet dataset's row groups,
        ahead (the stream does not depend on it); 0 = auto: half the host's cores, at most 8
        (1 on the 2-core dev machines).
      order: ``shuffle``: the shuffle buffer runs over the whole stream; ``time``: the data's
        time order, day after day (synthetic days, or a Parquet dataset's files, one per day),
        each day's examples shuffled only among themselves, in windows of
        ``shuffle_buffer`` examples (docs/data.md, "Days in time order").
      eval_protocol: ``final``: evaluate on the eval set (and every ``train.eval_every``);
        ``next_day``: train one day at a time and evaluate after each on the next day, one
        ``kind: day`` record per day in metrics.jsonl and a per-day table in summary.json
        (``days``; `recjax.train.days`).
      eval_day: the day a day-ordered dataset evaluates on (-1: its eval set as usual); set by
        ``eval_protocol=next_day``. For synthetic data, ``synthetic.eval_day``.
    """

    train: str = "synthetic"
    eval: str = ""
    holdout: float = 0.1
    split_seed: int = 0
    hash_buckets: int = 1 << 17
    multi_hot_len: int = 20
    skip_bad_lines: bool = False
    shuffle_buffer: int = 1 << 21
    cache_rows: int = field(default=10_000_000, metadata=RESUMABLE)
    cache_dir: str = field(default="", metadata=RESUMABLE)
    prefetch: int = field(default=4, metadata=RESUMABLE)
    workers: int = field(default=0, metadata=RESUMABLE)
    order: Literal["shuffle", "time"] = "shuffle"
    eval_protocol: Literal["final", "next_day"] = field(default="final", metadata=RESUMABLE)
    eval_day: int = field(default=-1, metadata=RESUMABLE)

    def __post_init__(self):
        check_choices(self, "data")
        if self.eval_day < -1:
            raise ValueError(f"data.eval_day must be a day (>= 0) or -1 (the eval set), got "
                             f"{self.eval_day}")
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"data.holdout must be in (0, 1), got {self.holdout}")
        if self.hash_buckets < 1:
            raise ValueError(f"data.hash_buckets must be >= 1, got {self.hash_buckets}")
        if self.workers < 0:
            raise ValueError(f"data.workers must be >= 0 (0 = auto), got {self.workers}")
        if self.multi_hot_len < 1:
            raise ValueError(f"data.multi_hot_len must be >= 1, got {self.multi_hot_len}")
        if self.split_seed > SEED_MAX:
            raise ValueError(f"data.split_seed must be <= 2**63 - 1 (seeds are 64-bit integers), "
                             f"got {self.split_seed}")
        for name, meaning in (("split_seed", "a seed"), ("shuffle_buffer", "0 = file order"),
                              ("cache_rows", "0 = no in-memory cache"),
                              ("prefetch", "0 = no prefetch thread")):
            if getattr(self, name) < 0:
                raise ValueError(f"data.{name} must be >= 0 ({meaning}), got "
                                 f"{getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class EmbedConfig:
    """Embedding tables.

    Attributes:
      pooling: sum | mean over the ids of a multi-hot field.
      init: "dlrm" (U(+-1/sqrt(V)) per table) or a float std of a normal init.
      store: where the host-async engine keeps the rows: fixed = one row per hash bucket
        (tables of ``data.hash_buckets`` rows) | lru = dynamic ids: the readers emit raw 64-bit
        ids (field and value, no modulo hashing) and each table is an LRU store of ``capacity``
        rows (recjax/embeddings/dynamic.py; Persia Sec. 4.2.2). Host-async algorithms only.
      capacity: rows per table of the lru store (the least recently used rows are evicted).
      admit_probability: lru store: a new id is admitted with this probability (drawn
        deterministically from (seed, id)); an id not admitted reads its initial row and its
        gradient is dropped and counted.
      init_by_id: draw each row from (train.seed, table, id) as the lru store does, instead of
        one generator per table; lets a fixed-table run start where an lru run starts.
      dims: per-table embedding dims, a rule table ``"regex:dim;regex:dim"`` over the tables'
        names (a field's ``table``, e.g. ``C1``), first match wins, unmatched tables keep
        ``model.embed_dim``; e.g. ``"C1|C2:32;C1[0-9]:4"``. Every dim must be <= model.embed_dim:
        a narrower table's activations are zero-padded to it, which the deep towers of
        wide_deep and dcn read as the concatenation of the fields' own widths (FuxiCTR's
        per-feature ``embedding_dim``). Refused for dlrm, fm, deepfm (their pairwise dot
        products need one width) and lr (no embeddings); --algo single only. "" = off.
    """

    pooling: Literal[POOLINGS] = "sum"
    init: str = "dlrm"
    store: Literal["fixed", "lru"] = "fixed"
    capacity: int = 1 << 20
    admit_probability: float = 1.0
    init_by_id: bool = False
    dims: str = ""

    def __post_init__(self):
        check_choices(self, "embed")
        if self.capacity < 1:
            raise ValueError(f"embed.capacity must be >= 1 (rows per table), got {self.capacity}")
        if not 0.0 < self.admit_probability <= 1.0:
            raise ValueError(f"embed.admit_probability must be in (0, 1], got "
                             f"{self.admit_probability}")
        parse_dims(self.dims)
        if self.init != "dlrm":
            try:
                float(self.init)
            except ValueError:
                raise ValueError(f"embed.init must be 'dlrm' or a number, got {self.init!r}") from None


@dataclasses.dataclass(frozen=True)
class DenseOptimConfig:
    """Optimizer of the dense (replicated) parameters, built with optax.

    Attributes:
      name: sgd | momentum | adam | adamw | adagrad, optax's own: adagrad's accumulator starts
        at 0.1 with eps inside the root (the sparse Adagrad's starts at sparse.initial_accumulator,
        eps outside); adam computes its bias corrections 1 - b^t in float32 (a relative error of
        ~7e-6 in the first updates, which the sparse Adam avoids).
      lr: learning rate.
      b1: Adam beta1 / momentum.
      b2: Adam beta2.
      eps: Adam/Adagrad epsilon.
      weight_decay: AdamW decoupled weight decay.
      clip_norm: global-norm gradient clipping (0 = off).
      lr_schedule: learning-rate schedule of the dense optimizer (recjax/train/schedules.py;
        optax schedules): constant | cosine (to ``end_lr_ratio * lr`` at ``decay_steps``) |
        linear (likewise) | step (``lr * decay_rate ** floor(t / decay_steps)``) | exponential
        (``lr * decay_rate ** (t / decay_steps)``); t counts steps after the warm-up. The
        embedding tables keep ``sparse.lr``.
      warmup_steps: linear warm-up from 0 to ``lr`` over this many steps before the schedule
        (0 = none; with ``constant`` a warm-up then a constant lr).
      decay_steps: cosine/linear: steps of the decay after the warm-up (then ``end_lr_ratio *
        lr`` on); step/exponential: steps per factor ``decay_rate``. Required (> 0) for every
        schedule but constant.
      end_lr_ratio: cosine/linear: the final lr as a fraction of ``lr``.
      decay_rate: step/exponential: the factor per ``decay_steps``, in (0, 1].
    """

    name: Literal["sgd", "momentum", "adam", "adamw", "adagrad"] = field(
        default="adam", metadata={"unknown": "optimizer"})
    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    lr_schedule: Literal[SCHEDULES] = "constant"
    warmup_steps: int = 0
    decay_steps: int = 0
    end_lr_ratio: float = 0.0
    decay_rate: float = 0.5

    def __post_init__(self):
        check_choices(self, "dense")
        if self.lr <= 0:
            raise ValueError(f"dense.lr must be > 0, got {self.lr}")
        check_schedule(self)


@dataclasses.dataclass(frozen=True)
class SpmdConfig:
    """SPMD algorithms on a device mesh (sync, DES); see algorithms/sync.py, algorithms/des.py.

    Attributes:
      mesh: axis sizes, e.g. "data=4,model=2"; empty = every device on one axis (the algorithm's
        default).
      table_rules: sharding rule table, "regex:type;regex:type" over table names, first match
        wins; types data_parallel | table_wise | row_wise | column_wise; empty = the
        algorithm's default.
      des_placement: DES field -> shard placement: round_robin (the paper's f mod N) | balanced.
      coordinator: jax.distributed coordinator address (set by scripts/launch.py).
      num_processes: processes in a multi-process run (1 = single process).
      process_id: this process's index.
      save_state: also write out/final_state.npz, the final state in the single-device layout
        (process 0 of a multi-process run; used to compare runs).
      heartbeat_timeout: seconds without a heartbeat after which jax.distributed's
        coordination service declares a process dead and stops the others (a multi-process
        run's bound on the wait for a peer that was killed; jax's default is 100).
      route_capacity: sync: owner routing of the row-sharded tables' ids with this many times
        the even share of unique rows per (source, owner) pair
        (sharding/routing.py; a step over capacity takes the exact masked path); 0 = always
        the masked path.
    """

    mesh: str = ""
    table_rules: str = ""
    des_placement: str = "round_robin"
    coordinator: str = ""
    num_processes: int = 1
    process_id: int = 0
    save_state: bool = False  # write out/final_state.npz (single-device layout) at the end
    route_capacity: float = 1.25
    heartbeat_timeout: int = 100  # s: a dead peer stops the other processes (jax.distributed)

    def __post_init__(self):
        check_choices(self, "spmd")
        if self.heartbeat_timeout < 1:
            raise ValueError(f"spmd.heartbeat_timeout must be >= 1 second, got "
                             f"{self.heartbeat_timeout}")
        if not (math.isfinite(self.route_capacity) and self.route_capacity >= 0):
            raise ValueError(f"spmd.route_capacity must be >= 0 (0 = no routing), got "
                             f"{self.route_capacity}")


@dataclasses.dataclass(frozen=True)
class DilocoConfig:
    """DiLoCo / local SGD on a device mesh (algorithms/diloco.py; Douillard et al. 2023, Alg. 1).

    Attributes:
      replicas: k, model replicas, each with its own dense params, embedding tables and inner
        optimizer state, each training on its B/k rows of every global batch; a multiple of
        the devices (each device holds k / devices whole replicas); 0 = one per device.
      inner_steps: H, inner steps (the ordinary train step, ``--dense.*`` and ``--sparse.*``
        being the inner optimizer) between two outer steps; a run's last round ends at
        ``train.steps``.
      outer_lr: the outer optimizer's learning rate (Nesterov SGD on the replicas' mean
        parameter delta; the paper's 0.7).
      outer_momentum: its Nesterov momentum (the paper's 0.9); 0 with outer_lr 1 makes the outer
        step the replicas' average: local SGD (Lin et al. 2018).
    """

    replicas: int = 0
    inner_steps: int = 8
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self):
        check_choices(self, "diloco")
        if self.replicas < 0:
            raise ValueError(f"diloco.replicas must be >= 0 (0 = one per device), got "
                             f"{self.replicas}")
        if self.inner_steps < 1:
            raise ValueError(f"diloco.inner_steps must be >= 1, got {self.inner_steps}")
        if not (math.isfinite(self.outer_lr) and self.outer_lr > 0):
            raise ValueError(f"diloco.outer_lr must be > 0, got {self.outer_lr}")
        if not 0.0 <= self.outer_momentum < 1.0:
            raise ValueError(f"diloco.outer_momentum must be in [0, 1), got {self.outer_momentum}")


ALGOS = registry.NAMES  # every --algo (recjax/registry.py)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training run.

    Attributes:
      algo: training algorithm, a row of recjax/registry.py (the choices below; ``--help``
        says what each is).
      batch_size: examples per step (global batch).
      microbatches: slices the dense forward/backward is looped over within a step (same
        gradient up to float summation order; faster on CPU for big MLPs at big batches, see
        docs/performance.md). 0 = auto: ~512-row slices of each device's batch on XLA:CPU,
        one pass on a GPU/TPU (where slicing costs up to 2.6x) and under DES (whose forward
        collectives every slice would repeat).
      epochs: passes over the training data (ignored when steps > 0).
      steps: train exactly this many steps (0 = run `epochs`).
      seed: seeds parameter init and data order (not the hold-out split: data.split_seed; not
        the synthetic task: synthetic.seed).
      eval_batch_size: examples per eval step.
      log_every: steps between progress/metrics.jsonl records.
      eval_every: steps between evals (0 = eval at the end only).
      ckpt_every: steps between checkpoints; 0 = at the end of the run, and at the end of
        each epoch in runs of >= 1000 steps (recjax/train/contract.py SHORT_RUN_STEPS).
      keep_ckpts: checkpoints kept on disk (>= 1); the oldest are deleted.
      out: output directory (summary.json, metrics.jsonl, checkpoints/); empty = write nothing.
      resume: continue from the latest checkpoint in out/checkpoints.
      save_predictions: write out/predictions.csv (label,prob per eval example, input order).
      tensorboard: also write TensorBoard event files to out/tb.
      deterministic: insist on bit-reproducible execution (the single trainer always is on CPU).
      devices: devices to use (0 = 1 for the single trainer).
      progress: show a progress bar.
      stop_after: stop (as if interrupted) after this many steps, keeping the checkpoint (tests).
      compile_cache: jax's persistent compilation cache (recjax/compile_cache.py): auto =
        $RECJAX_CACHE/jax (default ~/.cache/recjax/jax) | off (--no-compile-cache) | a directory.
      monitor: the eval metric of early stopping and of the best checkpoint: eval_auc (higher
        is better) | eval_ne | eval_logloss (lower is better); FuxiCTR's ``monitor``.
      early_stop_patience: stop after this many evals (every ``eval_every`` steps) in a row
        without a better ``monitor`` than the best so far (FuxiCTR's ``early_stop_patience``);
        0 = never stop early. Needs eval_every > 0; every --algo.
      keep_best: keep the checkpoint of the best eval so far in out/best/ and report
        best_step / best_metric in summary.json (always on with early stopping). Needs
        eval_every > 0.
      memory_check: refuse, before allocating, embedding tables and optimizer slots larger
        than this machine's available memory (false: tables that live on other hosts).
      unverified_resume: ``--resume`` may restore a checkpoint without an integrity record
        (written by a recjax version before checksums); otherwise such a step is damaged.
    """

    algo: Literal[ALGOS] = field(default="single", metadata={"unknown": "algorithm", **RESUMABLE})
    batch_size: int = 1024
    microbatches: int = 0
    epochs: int = field(default=1, metadata=RESUMABLE)
    steps: int = field(default=0, metadata=RESUMABLE)
    seed: int = 0
    eval_batch_size: int = field(default=8192, metadata=RESUMABLE)
    log_every: int = field(default=50, metadata=RESUMABLE)
    eval_every: int = field(default=0, metadata=RESUMABLE)
    ckpt_every: int = field(default=0, metadata=RESUMABLE)
    keep_ckpts: int = field(default=2, metadata=RESUMABLE)
    out: str = field(default="", metadata=RESUMABLE)
    resume: bool = field(default=False, metadata=RESUMABLE)
    save_predictions: bool = field(default=False, metadata=RESUMABLE)
    tensorboard: bool = field(default=False, metadata=RESUMABLE)
    deterministic: bool = field(default=False, metadata=RESUMABLE)
    devices: int = field(default=0, metadata=RESUMABLE)
    progress: bool = field(default=True, metadata=RESUMABLE)
    stop_after: int = field(default=0, metadata=RESUMABLE)
    compile_cache: str = field(default="auto", metadata=RESUMABLE)
    monitor: Literal[MONITOR_NAMES] = "eval_auc"
    early_stop_patience: int = field(default=0, metadata=RESUMABLE)
    keep_best: bool = field(default=False, metadata=RESUMABLE)
    memory_check: bool = field(default=True, metadata=RESUMABLE)
    unverified_resume: bool = field(default=False, metadata=RESUMABLE)

    def __post_init__(self):
        check_choices(self, "train")
        for name in ("batch_size", "epochs", "eval_batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.microbatches < 0 or (self.microbatches and self.batch_size % self.microbatches):
            raise ValueError(f"train.microbatches={self.microbatches} must divide "
                             f"train.batch_size={self.batch_size} (or be 0: auto)")
        # Negative values used to pass through silently: keep_ckpts=0 kept no checkpoint at all
        # and ckpt_every=-1 saved one every step.
        if self.keep_ckpts < 1:
            raise ValueError(f"train.keep_ckpts must be >= 1 (checkpoints kept on disk), got "
                             f"{self.keep_ckpts}")
        for name, meaning in (("steps", "0 = run train.epochs"),
                              ("seed", "a seed"),
                              ("eval_every", "0 = eval at the end only"),
                              ("ckpt_every", "0 = at the end (and each epoch's end in long runs)"),
                              ("stop_after", "0 = do not stop early"),
                              ("devices", "0 = the algorithm's default")):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0 ({meaning}), got "
                                 f"{getattr(self, name)}")
        if self.seed > SEED_MAX:  # a numpy int64 downstream: an OverflowError traceback
            raise ValueError(f"train.seed must be <= 2**63 - 1 (seeds are 64-bit integers), got "
                             f"{self.seed}")
        if self.resume and not self.out:
            raise ValueError("--resume needs --out DIR (the run directory holding checkpoints/)")
        if self.save_predictions and not self.out:
            raise ValueError("--save-predictions needs --out DIR to write predictions.csv into")
        check_early_stop(self)


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a run needs; `scripts/train.py --print-config` shows it."""

    data: DataConfig = DataConfig()
    synthetic: SyntheticConfig = SyntheticConfig()
    model: ModelConfig = ModelConfig()
    embed: EmbedConfig = EmbedConfig()
    dense: DenseOptimConfig = DenseOptimConfig()
    sparse: SparseOptimConfig = SparseOptimConfig()
    train: TrainConfig = TrainConfig()
    spmd: SpmdConfig = SpmdConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    shadowsync: ShadowSyncConfig = ShadowSyncConfig()
    gba: GbaConfig = GbaConfig()
    persia: PersiaConfig = PersiaConfig()
    ray: RayConfig = RayConfig()
    diloco: DilocoConfig = DilocoConfig()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class ConfigError(ValueError):
    """A bad override: unknown key or a value of the wrong type."""


def _parse_value(text: str, typ, key: str):
    """Parse `text` as the annotated type `typ` (bool, int, float, str, a ``Literal`` of strings,
    tuple[int, ...]). A ``Literal`` value is taken as text: the section's ``__post_init__``
    (`recjax.config_fields.check_choices`) refuses one outside the choices, naming them."""
    bad = ConfigError(f"{key}={text!r}: expected a value of type {getattr(typ, '__name__', typ)}")
    if is_text(typ):
        return text
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise bad
    if typ in (int, float):
        try:
            value = typ(text.replace("_", "") if typ is int else text)
        except ValueError:
            raise bad from None
        if typ is float and not math.isfinite(value):
            raise ConfigError(f"{key}={text!r}: must be a finite number")
        return value
    if typing.get_origin(typ) is tuple:
        elem = typing.get_args(typ)[0]
        parts = [p for p in text.strip("()[] ").split(",") if p.strip()]
        return tuple(_parse_value(p.strip(), elem, key) for p in parts)
    raise ConfigError(f"{key}: unsupported field type {typ}")


def override(cfg, key: str, text: str):
    """Return `cfg` with ``section.field`` set from the string `text`, type-checked.

    Raises:
      ConfigError: unknown section or field (with close matches), or a badly typed value, or a
        value the section's ``__post_init__`` refuses.
    """
    section, _, field = key.partition(".")
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    if section not in sections or not field:
        close = difflib.get_close_matches(key, _all_keys(cfg), n=3)
        raise ConfigError(f"unknown config key {key!r}" + (f"; did you mean {close}?" if close else
                          f"; keys look like section.field, sections: {sorted(sections)}"))
    sub = getattr(cfg, section)
    hints = typing.get_type_hints(type(sub))
    if field not in hints or field not in {f.name for f in dataclasses.fields(sub)}:
        close = difflib.get_close_matches(key, _all_keys(cfg), n=3)
        raise ConfigError(f"unknown config key {key!r}" + (f"; did you mean {close}?" if close else ""))
    value = _parse_value(text, hints[field], key)
    try:
        new_sub = dataclasses.replace(sub, **{field: value})
    except ValueError as e:
        raise ConfigError(f"{key}={text!r}: {e}") from None
    return dataclasses.replace(cfg, **{section: new_sub})


def _all_keys(cfg) -> list[str]:
    return [f"{s.name}.{f.name}" for s in dataclasses.fields(cfg)
            for f in dataclasses.fields(getattr(cfg, s.name))]


def apply_overrides(cfg, pairs: list[tuple[str, str]]):
    for key, text in pairs:
        cfg = override(cfg, key, text)
    return cfg
