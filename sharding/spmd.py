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
import numpy as np
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


def claim_out_everywhere(out: str, lead: bool) -> None:
    """The ``--out`` policy of a multi-process run (`recjax.train.contract.claim_out`): process 0,
    the one that writes ``--out``, takes its lock and refuses a directory holding a run; every
    process learns the verdict through one collective, so a refusal stops the whole job with
    the reason instead of leaving the other processes waiting in the first step.

    Raises:
      ValueError: on every process, when process 0 refused ``--out``.
    """
    from jax.experimental import multihost_utils

    error = ""
    if lead and out:
        try:
            contract.claim_out(out)
        except (ValueError, OSError) as e:
            error = str(e)
    refused = int(multihost_utils.broadcast_one_to_all(np.int32(bool(error))))
    if error:
        raise ValueError(error)
    if refused:
        raise ValueError(f"process 0 refused --out {out} (its error names why); use another "
                         "--out or free that one")


def run_spmd(cfg: Config, setup_cls, strategy_cls) -> dict:
    """Set up devices, check the config, train with the shared trainer, write the outputs.

    In a multi-process run every process trains (SPMD) and process 0 writes ``--out``:
    summary.json, metrics.jsonl, predictions.csv and TensorBoard events as a single process
    does, and final_state.npz with ``spmd.save_state``, under the ``--out`` policy of every run
    (`claim_out_everywhere`). It writes no checkpoints (each process holds only its shards of
    the state), so ``--resume`` is refused up front.
    """
    multi = cfg.spmd.num_processes > 1
    if multi and cfg.train.resume:
        raise ValueError("--resume: a multi-process run writes no checkpoints to resume from; "
                         "resume single-process runs only, or rerun without --resume")
    n = mesh.init_runtime(cfg)
    setup = setup_cls.from_config(cfg, n)  # every config error is raised here, before compiling
    lead = jax.process_index() == 0
    if multi:
        claim_out_everywhere(cfg.train.out, lead)
    inner = cfg
    if multi and not lead:
        inner = dataclasses.replace(cfg, train=dataclasses.replace(
            cfg.train, out="", save_predictions=False, tensorboard=False, progress=False))
    made = []

    def make_strategy(_cfg, model, tx, sparse_opt):
        made.append(strategy_cls(setup, model, tx, sparse_opt))
        return made[0]

    summary = loop.run(inner, make_strategy, checkpoints=not multi)
    state = summary.pop("final_state", None)
    out = cfg.train.out
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
