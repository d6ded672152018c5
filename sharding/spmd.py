"""The SPMD plumbing shared by sync and DES (DESIGN.md section 4.1).

    summary = run_spmd(cfg, SyncSetup, SyncStrategy)   all of algorithms.sync.run
    summary = run_spmd(cfg, DesSetup, DesStrategy)     all of algorithms.des.run

`run_spmd` sets up the devices (`sharding.mesh.init_runtime`), builds the algorithm's setup
(every config error is raised there, before anything compiles), trains with the shared trainer
`recjax.train.loop.run` through the algorithm's `loop.Strategy`, and writes the multi-process
outputs and ``final_state.npz``. The helpers serve both algorithms' setups and strategies:
`feature_spec` (the data's schema without reading it), `batch_specs` (the batch's
`PartitionSpec`s), `global_metrics` (per-shard -> global-batch metrics), `abstract_batch`
(shapes to trace a step with) and `gather` (a per-shard array -> the global batch's).
What differs between the algorithms (placement, the step, prediction) stays in ``algorithms/``.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from recjax.batch import Batch
from recjax.config import Config
from recjax.data.sources import open_source
from recjax.data.synthetic import SyntheticSource, synthetic_name
from recjax.features import FeatureSpec
from recjax.runlog import write_json_atomic
from recjax.train import contract, loop
from recjax.train.step import StepMetrics
from sharding import mesh


def feature_spec(cfg: Config) -> FeatureSpec:
    """The training data's schema, without reading the data (for checks before any compile)."""
    if synthetic_name(cfg.data.train) is not None:
        return SyntheticSource(cfg.synthetic).spec
    return open_source(cfg.data.train, hash_buckets=cfg.data.hash_buckets,
                       multi_hot_len=cfg.data.multi_hot_len).spec


def batch_specs(mask: bool, ids_spec: P | None = None) -> Batch:
    """Batch split on ``data``; `ids_spec` overrides the ids/mask spec (DES: by field too)."""
    ids_spec = ids_spec or P("data")
    return Batch(P("data"), ids_spec, ids_spec if mask else None, P("data"))


def global_metrics(m: StepMetrics, data_axis: str | tuple[str, ...] = "data") -> StepMetrics:
    """Per-shard metrics -> the global batch's (mean loss, summed counts) over `data_axis`."""
    sums = [jax.lax.psum(getattr(m, k), data_axis) for k in StepMetrics._fields[1:]]
    return StepMetrics(jax.lax.pmean(m.loss, data_axis), *sums)


def abstract_batch(cfg: Config, spec: FeatureSpec, batch_size: int) -> Batch:
    """Shapes and dtypes of a `batch_size` batch of `spec` (to trace a step without data)."""
    f32, i32 = np.float32, np.int32
    ids = jax.ShapeDtypeStruct((batch_size, spec.n_fields, spec.max_len), i32)
    mask = jax.ShapeDtypeStruct(ids.shape, f32) if spec.masked else None
    return Batch(jax.ShapeDtypeStruct((batch_size, spec.n_dense), f32), ids, mask,
                 jax.ShapeDtypeStruct((batch_size,), f32))


def gather(x, axes=("data",)):
    """The whole global batch of a per-shard array (rows in global order)."""
    return jax.lax.all_gather(x, axes, axis=0, tiled=True, to="invarying")


def is_global(tree) -> bool:
    """Whether `tree` holds arrays spread over several processes (a multi-process restore)."""
    return jax.process_count() > 1 and any(
        isinstance(x, jax.Array) and not x.is_fully_addressable for x in jax.tree.leaves(tree))


def named(mesh, specs):
    """PartitionSpecs (a pytree prefix) -> NamedShardings on `mesh`."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda s: isinstance(s, P))


class CheckpointLayout:
    """What a multi-process checkpoint needs of an SPMD strategy, on its devices.

    A strategy defines ``_to_logical(state) -> TrainState`` (its state in the single-device
    layout, written with jax.numpy so that it jits) and ``_from_logical(state, *extra)`` (the
    inverse, its own layout), and ``_specs_of(shapes)`` (its layout's PartitionSpecs). Then:

    * `logical`: the state as the checkpoint stores it (`recjax.checkpoint_sharded.Stored`:
      the single-device layout, tables and slots padded to whole rows per device by
      `padded_rows`, each array split by `layout`), computed where the shards are: what every
      process writes its own blocks of. A row-wise table is then written from the rows each
      device trains, so a save moves no rows between processes (tests/test_pod_layout.py
      checks the compiled program of sync on one mesh axis has no collective);
    * `place_restored`: a restored checkpoint (global arrays in the checkpoint layout of this
      mesh, each process holding only its blocks) -> the strategy's layout, on the devices.

    Both are data movement only (slices, concatenations, pads), so a state survives
    ``place_restored(logical(state))`` bit for bit (tests/test_pod_layout.py).
    """

    def logical(self, state):
        from recjax.checkpoint_sharded import Stored, padded_rows, shardings

        if getattr(self, "_logical_jit", None) is None:
            mesh = self.mesh

            def pad(x):
                rows = padded_rows(x.shape, mesh)
                return x if rows == x.shape else jnp.pad(
                    x, [(0, rows[0] - x.shape[0])] + [(0, 0)] * (x.ndim - 1))

            def stored(s):
                t = self._to_logical(s)
                return t._replace(tables=jax.tree.map(pad, t.tables),
                                  slots=jax.tree.map(pad, t.slots))

            shapes = jax.eval_shape(self._to_logical, state)
            self._logical_shapes = tuple(x.shape for x in jax.tree.leaves(shapes))
            self._logical_jit = jax.jit(stored, out_shardings=shardings(
                jax.eval_shape(stored, state), mesh))
        return Stored(self._logical_jit(state), self._logical_shapes)

    def place_restored(self, state, *extra):
        from recjax.checkpoint_sharded import Stored

        if isinstance(state, Stored):
            state = state.unpadded()
        shapes = jax.eval_shape(self._from_logical, state, *extra)
        self.specs = self._specs_of(shapes)
        return jax.jit(self._from_logical, out_shardings=named(self.mesh, self.specs))(
            state, *extra)


def claim_out_everywhere(out: str, lead: bool, resume: bool = False) -> None:
    """The ``--out`` policy of a multi-process run (`recjax.train.contract.claim_out`): process 0,
    the one that writes ``--out``, takes its lock and refuses a directory holding a run (unless
    `resume`); every process learns the verdict through one collective, so a refusal stops the
    whole job with the reason instead of leaving the other processes waiting in the first step.

    Raises:
      ValueError: on every process, when process 0 refused ``--out``.
    """
    from jax.experimental import multihost_utils

    error = ""
    if lead and out:
        try:
            contract.claim_out(out, resume)
        except (ValueError, OSError) as e:
            error = str(e)
    refused = int(multihost_utils.broadcast_one_to_all(np.int32(bool(error))))
    if error:
        raise ValueError(error)
    if refused:
        raise ValueError(f"process 0 refused --out {out} (its error names why); use another "
                         "--out or free that one")


class _Checkpoints:
    """``() -> ShardedCheckpointer`` for `loop.run` in every process (the ones without --out
    read `resume` here; `recjax.train.contract.open_run`)."""

    def __init__(self, tc, mesh):
        self.tc, self.mesh, self.resume = tc, mesh, tc.resume

    def __call__(self):
        from recjax.checkpoint_sharded import ShardedCheckpointer

        tc = self.tc
        return ShardedCheckpointer(os.path.join(tc.out, "checkpoints"), self.mesh,
                                   tc.keep_ckpts, unverified=tc.unverified_resume)


def run_rows_read(mine: dict) -> dict:
    """A multi-process run's ``data_rows_read`` (`recjax.train.data.rows_read`): each process
    reads its own block of every batch, so the run's reads are the processes' added up
    (``train``, ``eval``), with each process's beside them (``by_process``, in process order).
    A collective: every process calls it."""
    from jax.experimental import multihost_utils

    keys, unit = ("train", "eval"), 1 << 30  # counts as int32 pairs (JAX without x64)
    have = np.array([part for k in keys for part in (
        (-1, 0) if mine.get(k) is None else divmod(int(mine[k]), unit))], np.int32)
    every = np.asarray(multihost_utils.process_allgather(have)).astype(np.int64)
    counts = every[:, 0::2] * unit + every[:, 1::2]  # [processes, keys]; < 0: not counted
    out = {k: None if (counts[:, i] < 0).any() else int(counts[:, i].sum())
           for i, k in enumerate(keys)}
    out["by_process"] = [{k: None if v < 0 else int(v) for k, v in zip(keys, row)}
                         for row in counts]
    return out


def run_spmd(cfg: Config, setup_cls, strategy_cls) -> dict:
    """Set up devices, check the config, train with the shared trainer, write the outputs.

    In a multi-process run every process trains (SPMD) and process 0 writes ``--out``:
    summary.json, metrics.jsonl, predictions.csv and TensorBoard events as a single process
    does, and final_state.npz with ``spmd.save_state``, under the ``--out`` policy of every run
    (`claim_out_everywhere`). Every process writes its own shards of each checkpoint
    (`recjax.checkpoint_sharded`, in the single-device layout, so ``--resume`` works from and
    onto any process count, mesh or algorithm), and the processes stop together: a SIGINT or
    SIGTERM to any one of them is seen by all at the next step boundary (`agree_any`, one
    collective per step), where they write one checkpoint and exit 130.
    """
    from recjax.checkpoint_sharded import agree_any

    multi = cfg.spmd.num_processes > 1
    tc = cfg.train
    if multi and tc.keep_best:
        raise ValueError("train.keep_best: a multi-process run keeps no out/best checkpoint yet; "
                         "drop --train.keep_best (early stopping alone works), or run the "
                         "evaluation of the checkpoints afterwards")
    n = mesh.init_runtime(cfg)
    setup = setup_cls.from_config(cfg, n)  # every config error is raised here, before compiling
    lead = jax.process_index() == 0
    if multi:
        claim_out_everywhere(tc.out, lead, tc.resume)
    inner = cfg
    if multi and not lead:
        inner = dataclasses.replace(cfg, train=dataclasses.replace(
            tc, out="", resume=False, save_predictions=False, tensorboard=False,
            progress=False))
    made = []

    def make_strategy(_cfg, model, tx, sparse_opt):
        made.append(strategy_cls(setup, model, tx, sparse_opt))
        return made[0]

    checkpoints, agree = True, None
    if multi:
        checkpoints = _Checkpoints(tc, setup.mesh) if tc.out else False
        agree = agree_any
    summary = loop.run(inner, make_strategy, checkpoints=checkpoints, agree=agree)
    state = summary.pop("final_state", None)
    if multi and "data_rows_read" in summary:  # (every process is here: it gathers)
        summary["data_rows_read"] = run_rows_read(summary["data_rows_read"])
    out = tc.out
    if cfg.spmd.save_state and state is not None:
        host = made[0].unshard(state)
        if lead and out:
            flat = jax.tree_util.tree_flatten_with_path(host)[0]
            os.makedirs(out, exist_ok=True)
            path = os.path.join(out, "final_state.npz")
            with open(path + ".tmp", "wb") as f:  # temp then rename: never a half-written file
                np.savez(f, **{jax.tree_util.keystr(k): np.asarray(v) for k, v in flat})
            os.replace(path + ".tmp", path)
    if multi and lead and out and "stopped_at" not in summary:
        write_json_atomic(os.path.join(out, "summary.json"),
                          summary | {"num_processes": cfg.spmd.num_processes})
    return summary | {"final_state": state}
