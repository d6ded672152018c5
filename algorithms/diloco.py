"""DiLoCo / local SGD on a device mesh: k replicas take H inner steps, then one outer step.

    python scripts/train.py --algo diloco --devices 4 --config smoke --steps 24 \\
        --diloco.inner_steps 4 --diloco.outer_lr 0.7 --diloco.outer_momentum 0.9

Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models",
Alg. 1, built by wrapping the ordinary train step (maxtext's ``diloco.py``):

    for outer step t = 1 .. T:
        for replica i = 1 .. k, in parallel:                   `inner_steps`, H times a round
            theta_i <- theta^(t-1)                             (every replica restarts from theta)
            for inner step h = 1 .. H:
                x ~ D_i                                        its B/k rows of the global batch
                theta_i <- InnerOpt(theta_i, grad f(x, theta_i))   recjax.train.step.train_step
        Delta^(t) = 1/k sum_i (theta^(t-1) - theta_i)            `outer_step`: one all-reduce
        theta^(t) = OuterOpt(theta^(t-1), Delta^(t))             Nesterov SGD (outer_lr, momentum)

theta is every parameter: the dense params *and* the embedding tables, each replicated per
replica and averaged in the outer step like any other weight (the paper's algorithm read
literally; docs/diloco.md weighs the alternatives and the memory: k copies of the tables and
their slots, plus theta and the outer momentum on every device). InnerOpt is the run's dense
(``--dense.*``) and sparse (``--sparse.*``) optimizer; each replica keeps its own inner
optimizer state across rounds (Alg. 1 resets only the parameters). With H = 1, outer lr 1,
momentum 0 and plain SGD inside, one round is one step of ``--algo sync`` on the same global
batch (Lin et al. 2018's local SGD with period 1; tests/test_diloco.py).

Placement: ``k`` replicas on a 1-D mesh ``data`` of n devices, k / n whole replicas per device
(`jax.vmap` over them), every leaf of their `TrainState` stacked on a leading axis of k and
split on ``data``; theta and the outer optimizer state replicated. An inner step communicates
only the step's metrics; the outer step one all-reduce of theta's size. `inner_steps` and
`outer_step` without a mesh (``mean`` over the stacked axis) are the single-device reference.

Checkpoints (the shared trainer's single-device layout): theta at the last outer step, its
step, and the replicas' inner optimizer states averaged (integer counters: replica 0's, equal
on all). The outer momentum and the per-replica inner states are not in that layout, so a
resume is bitwise the uninterrupted run when neither carries information (outer momentum 0,
stateless inner optimizers, e.g. SGD); otherwise it restarts them. A checkpoint taken inside
a round (an interrupt, an epoch-end save) is the round's start, labelled with its step: the
resumed run replays the round.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from recjax.batch import Batch
from recjax.config import Config
from recjax.embeddings import make_sparse_optimizer
from recjax.features import FeatureSpec
from recjax.train.setup import make_model, table_bytes
from recjax.train.step import StepMetrics, TrainState, predict, train_step
from sharding import arrays, comm, mesh
from sharding.spmd import (
    CheckpointLayout,
    abstract_batch,
    batch_specs,
    feature_spec,
    global_metrics,
    is_global,
    run_spmd,
)

AXIS = "data"  # the replicas' mesh axis


class DilocoState(NamedTuple):
    """The state the strategy's steps carry; a pytree.

    Attributes:
      step: i32[] global steps so far (every replica's inner steps; examples = step x B).
      params: theta's dense params (what evaluation reads, as a `TrainState`'s).
      tables: theta's embedding tables.
      outer_opt_state: the outer optimizer's state over ``(params, tables)``.
      inner: the replicas' `TrainState`, every leaf stacked on a leading axis of k.
      round_start: i32[] the step of the last outer step (or of the start): what a checkpoint
        labels theta with.
      batch_stats: () (no batch norm under DiLoCo), so ``eval_params`` reads ``params``.
    """

    step: jax.Array
    params: Any
    tables: dict
    outer_opt_state: Any
    inner: TrainState
    round_start: jax.Array
    batch_stats: Any = ()


def outer_optimizer(outer_lr: float, outer_momentum: float) -> optax.GradientTransformation:
    """OuterOpt of Alg. 1, the paper's choice: SGD with Nesterov momentum (optax's ``trace``:
    ``M <- Delta + mu M``, ``theta -= lr (Delta + mu M)``). Momentum 0 keeps no trace: the same
    updates (``g + 0 = g``) without a table-sized zero buffer."""
    return optax.sgd(outer_lr, momentum=outer_momentum or None, nesterov=True)


def init(state: TrainState, k: int, tx: optax.GradientTransformation) -> DilocoState:
    """theta = the state's params and tables; every replica starts from the whole state."""
    theta = (state.params, state.tables)
    inner = jax.tree.map(lambda x: jnp.broadcast_to(x, (k, *jnp.shape(x))), state)
    return DilocoState(state.step, state.params, state.tables, tx.init(theta), inner, state.step)


def inner_steps(model, tx, opt, inner: TrainState, batch: Batch) -> tuple[TrainState, StepMetrics]:
    """One inner step of every replica: the ordinary train step, mapped over the stacked axis.

    Args:
      inner: replicas' states, leaves ``[k, ...]``.
      batch: leaves ``[k, B/k, ...]``: replica i's rows of the global batch.

    Returns:
      the replicas' new states and their metrics, leaves ``[k]``.
    """
    return jax.vmap(functools.partial(train_step, model, tx, opt))(inner, batch)


def _stacked_mean(x: jax.Array) -> jax.Array:
    return jnp.mean(x, axis=0)


def outer_step(tx: optax.GradientTransformation, params, tables: dict, opt_state,
               inner: TrainState, mean=_stacked_mean):
    """Alg. 1's outer step: ``Delta = theta - 1/k sum_i theta_i``, ``theta <- OuterOpt(theta,
    Delta)``, every replica restarted from the new theta (its inner optimizer state kept).

    Args:
      mean: ``[k_local, ...] -> [...]``, the mean over every replica: over the stacked axis
        (single device), or that and a ``pmean`` over the mesh (`DilocoStrategy`).

    Returns:
      ``(params, tables, opt_state, inner)`` after the step.
    """
    theta = (params, tables)
    avg = jax.tree.map(mean, (inner.params, inner.tables))      # 1/k sum_i theta_i^(t)
    delta = jax.tree.map(jnp.subtract, theta, avg)              # Delta^(t), the outer gradient
    updates, opt_state = tx.update(delta, opt_state, theta)     # OuterOpt
    params, tables = optax.apply_updates(theta, updates)        # theta^(t)
    restart = lambda new, old: jnp.broadcast_to(new, old.shape)  # noqa: E731  theta_i <- theta^(t)
    inner = inner._replace(params=jax.tree.map(restart, params, inner.params),
                           tables=jax.tree.map(restart, tables, inner.tables))
    return params, tables, opt_state, inner


def replica_batch(batch: Batch, k: int) -> Batch:
    """A global batch ``[B, ...]`` as ``[k, B/k, ...]``: replica i gets rows ``i B/k ..``
    (arrays, or the `jax.ShapeDtypeStruct`\\ s of a batch to trace a step with)."""

    def split(x):
        shape = (k, x.shape[0] // k, *x.shape[1:])
        return (jax.ShapeDtypeStruct(shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct)
                else x.reshape(shape))

    return Batch(*(None if x is None else split(x) for x in batch))


def _host_mean(x: np.ndarray) -> np.ndarray:
    """The replicas' mean of a stacked leaf; an integer counter (equal on all) is replica 0's."""
    return x.mean(axis=0, dtype=x.dtype) if np.issubdtype(x.dtype, np.floating) else x[0]


@dataclasses.dataclass(frozen=True)
class DilocoSetup:
    """Everything decided from the config before any JAX computation (so errors come first).

    Attributes:
      replicas: k.
      inner_steps: H.
    """

    cfg: Config
    spec: FeatureSpec
    mesh: object
    replicas: int
    inner_steps: int

    @classmethod
    def from_config(cls, cfg: Config, n_devices: int, spec: FeatureSpec | None = None
                    ) -> DilocoSetup:
        spec = spec or feature_spec(cfg)
        dc, tc = cfg.diloco, cfg.train
        sizes = mesh.mesh_shape(cfg.spmd.mesh, (AXIS, "model"), n_devices, AXIS)
        if sizes["model"] > 1:
            raise ValueError(f"--mesh {cfg.spmd.mesh}: --algo diloco keeps every replica whole "
                             f"on a device (a 1-D mesh); use --mesh {AXIS}={n_devices} or drop "
                             "--mesh")
        n = sizes[AXIS]
        k = dc.replicas or n
        if k % n:
            raise ValueError(f"diloco.replicas={k} is not a multiple of the {n} devices: each "
                             f"device holds the same number of whole replicas; use "
                             f"{n * max(k // n, 1)} (or 0: one per device)")
        if tc.batch_size % k:
            raise ValueError(f"--batch-size {tc.batch_size} does not split into diloco.replicas="
                             f"{k} equal replica batches; use a multiple of {k}")
        if tc.microbatches and (tc.batch_size // k) % tc.microbatches:
            raise ValueError(f"train.microbatches={tc.microbatches} must divide each replica's "
                             f"batch of {tc.batch_size // k} rows (batch_size / diloco.replicas)")
        if tc.ckpt_every % dc.inner_steps:
            raise ValueError(f"train.ckpt_every={tc.ckpt_every} is not a multiple of "
                             f"diloco.inner_steps={dc.inner_steps}: a checkpoint holds theta at "
                             "an outer step; use a multiple (or 0)")
        model = make_model(cfg, spec)
        _check_memory(cfg, model.layout, k)
        return cls(cfg, spec, mesh.make_mesh({AXIS: n}), k, dc.inner_steps)


def _check_memory(cfg: Config, layout, k: int) -> None:
    """Refuse k replicas of the tables and slots (plus theta and the outer momentum) that do not
    fit this machine's available memory (`recjax.train.setup.check_memory` sizes one copy)."""
    if not cfg.train.memory_check:
        return
    import psutil

    one = sum(table_bytes(layout, make_sparse_optimizer(cfg.sparse)).values())
    tables = sum(t.num_embeddings * t.embedding_dim * 4 for t in layout.tables)
    need = k * one + tables * (2 if cfg.diloco.outer_momentum else 1)
    have = psutil.virtual_memory().available
    if need > have:
        gib = 2.0**30
        raise ValueError(f"--algo diloco holds diloco.replicas={k} copies of the embedding tables "
                         f"and their slots ({one / gib:,.1f} GiB each) and theta's tables beside "
                         f"them: {need / gib:,.1f} GiB, more than the {have / gib:,.1f} GiB "
                         "available; lower diloco.replicas or --data.hash_buckets, or "
                         "--train.memory_check=false (devices with their own memory)")


class DilocoStrategy(CheckpointLayout):
    """`loop.Strategy` of DiLoCo on ``setup.mesh``: k replicas on the ``data`` axis."""

    name = "diloco"

    def __init__(self, setup: DilocoSetup, model, tx, sparse_opt):
        self.setup, self.model, self.tx, self.opt = setup, model, tx, sparse_opt
        self.mesh, self.k, self.h = setup.mesh, setup.replicas, setup.inner_steps
        dc = setup.cfg.diloco
        self.outer_tx = outer_optimizer(dc.outer_lr, dc.outer_momentum)
        self.total = setup.cfg.train.steps  # a run's last round ends here (0: epochs)
        self.outer_steps = 0
        self.comm: dict = {}
        self._noted = False

    # -- placement: theta and the outer state replicated, the replicas split on AXIS --
    SPECS = DilocoState(P(), P(), P(), P(), P(AXIS), P(), ())

    def extra(self, state: DilocoState) -> dict | None:
        """What a checkpoint needs beside theta for a bitwise resume, at an outer step (the
        replicas then hold theta): the outer optimizer's state and every replica's own inner
        optimizer state and sparse slots. None inside a round (the checkpoint is theta at the
        round's start, whose inner states are gone: the resumed run replays the round)."""
        host = arrays.fetch((state.step, state.round_start))
        if int(host[0]) != int(host[1]):
            return None
        extra = {"outer_opt_state": state.outer_opt_state,
                 "inner_opt_state": state.inner.opt_state, "inner_slots": state.inner.slots}
        # a multi-process run writes the global arrays where they are (`CheckpointLayout`)
        return extra if jax.process_count() > 1 else jax.device_get(extra)

    def extra_like(self, state: TrainState) -> dict:
        """`extra`'s structure for this run (k replicas) from a single-device state."""
        theta = (state.params, state.tables)
        stack = lambda x: np.zeros((self.k, *np.shape(x)), np.dtype(x.dtype))  # noqa: E731
        return {"outer_opt_state": jax.tree.map(
                    lambda s: np.zeros(s.shape, s.dtype),
                    jax.eval_shape(self.outer_tx.init, theta)),
                "inner_opt_state": jax.tree.map(stack, state.opt_state),
                "inner_slots": jax.tree.map(stack, state.slots)}

    def prepare(self, state: TrainState, extra: dict | None = None) -> DilocoState:
        """`init` of the (fresh or restored) single-device state, built on the host and placed:
        no device holds more than its own replicas; `extra` (`extra`, from the checkpoint) gives
        back the outer state and each replica's own inner state."""
        if is_global(state):  # a multi-process checkpoint restored onto this mesh
            if extra is None and int(state.step) > 0 and self._lossy(state):
                self._note_lossy(int(state.step))
            placed = self.place_restored(state, *([] if extra is None else [extra]))
            self._step = int(state.step)
            self._build(placed)
            return placed
        host = arrays.fetch(state)
        if extra is not None:
            theta = (host.params, host.tables)
            inner = jax.tree.map(lambda x: np.broadcast_to(x, (self.k, *np.shape(x))), host)
            inner = inner._replace(opt_state=extra["inner_opt_state"], slots=extra["inner_slots"])
            start = DilocoState(host.step, host.params, host.tables, extra["outer_opt_state"],
                                inner, host.step)
            placed = arrays.put_tree(start, self.mesh, self.SPECS)
            self._step = int(host.step)
            self._build(placed)
            return placed
        if int(host.step) > 0 and self._lossy(host):
            self._note_lossy(int(host.step))
        theta = (host.params, host.tables)
        zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),  # optax.sgd's init: zeros
                             jax.eval_shape(self.outer_tx.init, theta))
        inner = jax.tree.map(lambda x: np.broadcast_to(x, (self.k, *np.shape(x))), host)
        start = DilocoState(host.step, host.params, host.tables, zeros, inner, host.step)
        placed = arrays.put_tree(start, self.mesh, self.SPECS)
        self._step = int(host.step)
        self._build(placed)
        return placed

    @staticmethod
    def _note_lossy(step: int) -> None:
        print(f"note: --algo diloco starts from step {step}'s checkpoint: theta and "
              "the replicas' mean inner optimizer state; the outer momentum and each "
              "replica's own inner state restart, so this run is not bitwise an "
              "uninterrupted one (docs/diloco.md)", file=sys.stderr, flush=True)

    def _lossy(self, host: TrainState) -> bool:
        """Whether a checkpoint loses state here: an outer momentum, or a float inner slot."""
        floats = [x for x in jax.tree.leaves((host.opt_state, host.slots))
                  if np.issubdtype(np.dtype(x.dtype), np.floating)]
        return bool(self.setup.cfg.diloco.outer_momentum or floats)

    # the single-device layout on the devices (`CheckpointLayout`: multi-process checkpoints)
    def _to_logical(self, state: DilocoState) -> TrainState:
        """`unshard` where the shards are (the replicas' mean in jax: float rounding of
        another summation order than `unshard`'s numpy mean)."""
        mean = lambda x: (x.mean(axis=0, dtype=x.dtype)  # noqa: E731
                          if jnp.issubdtype(x.dtype, jnp.floating) else x[0])
        inner = state.inner
        return TrainState(state.round_start, state.params, jax.tree.map(mean, inner.opt_state),
                          state.tables, jax.tree.map(mean, inner.slots), ())

    def _from_logical(self, state: TrainState, extra: dict | None = None) -> DilocoState:
        """`prepare`'s host path on the devices: theta and k replicas of the state, and the
        outer and inner states of `extra` (else the outer optimizer's fresh zeros)."""
        inner = jax.tree.map(lambda x: jnp.broadcast_to(x, (self.k, *jnp.shape(x))), state)
        outer = self.outer_tx.init((state.params, state.tables))
        if extra is not None:
            inner = inner._replace(opt_state=extra["inner_opt_state"], slots=extra["inner_slots"])
            outer = extra["outer_opt_state"]
        return DilocoState(state.step, state.params, state.tables, outer, inner, state.step)

    def _specs_of(self, shapes: DilocoState) -> DilocoState:
        return self.SPECS

    def unshard(self, state: DilocoState) -> TrainState:
        """theta in the single-device layout at the last outer step, labelled with its step;
        the inner optimizer states averaged over the replicas (host numpy)."""
        host = arrays.fetch(DilocoState(state.step, state.params, state.tables, (),
                                        state.inner._replace(params=(), tables=()),
                                        state.round_start))
        start, step = int(host.round_start), int(host.step)
        if start != step and not self._noted:
            self._noted = True
            print(f"note: step {step} is inside a DiLoCo round (diloco.inner_steps={self.h}); "
                  f"the state kept is theta at step {start}, where a resumed run replays the "
                  "round (docs/diloco.md)", file=sys.stderr, flush=True)
        inner = host.inner
        return TrainState(np.asarray(start, np.int32), host.params,
                          jax.tree.map(_host_mean, inner.opt_state), host.tables,
                          jax.tree.map(_host_mean, inner.slots), ())

    def put_batch(self, batch: Batch) -> Batch:
        split = replica_batch(batch, self.k)
        return arrays.put_tree(split, self.mesh, batch_specs(batch.mask is not None))

    # -- the steps --
    def _inner_body(self, inner: TrainState, batch: Batch):
        inner, m = inner_steps(self.model, self.tx, self.opt, inner, batch)
        local = StepMetrics(jnp.mean(m.loss), *(jnp.sum(getattr(m, f))
                                                for f in StepMetrics._fields[1:]))
        return inner, global_metrics(local, AXIS)  # the loss of the global batch, summed counts

    def _inner(self, state: DilocoState, batch: Batch):
        mask = batch.mask is not None
        inner, metrics = jax.shard_map(
            self._inner_body, mesh=self.mesh,
            in_specs=(P(AXIS), batch_specs(mask)), out_specs=(P(AXIS), P()),
        )(state.inner, batch)
        return state._replace(step=state.step + 1, inner=inner), metrics

    def _outer(self, state: DilocoState) -> DilocoState:
        mean = lambda x: jax.lax.pmean(jnp.mean(x, axis=0), AXIS)  # noqa: E731  over all k
        params, tables, opt_state, inner = jax.shard_map(
            functools.partial(outer_step, self.outer_tx, mean=mean), mesh=self.mesh,
            in_specs=(P(), P(), P(), P(AXIS)), out_specs=(P(), P(), P(), P(AXIS)),
        )(state.params, state.tables, state.outer_opt_state, state.inner)
        return state._replace(params=params, tables=tables, outer_opt_state=opt_state,
                              inner=inner, round_start=state.step)

    def train_step(self, state: DilocoState, batch: Batch):
        """One global step: every replica's inner step; at a round's end, the outer step."""
        state, metrics = self._inner_jit(state, batch)
        self._step += 1
        if self._step % self.h == 0 or self._step == self.total:
            state = self._outer_jit(state)
            self.outer_steps += 1
        return state, metrics

    def _predict_body(self, params, tables, batch):
        # every process gets every logit (the eval reads them on the host; split over the
        # processes of a multi-process run, no process could read the others')
        return jax.lax.all_gather(predict(self.model, params, tables, batch), AXIS, axis=0,
                                  tiled=True, to="invarying")

    def predict(self, params, tables, batch: Batch):
        """Logits of a host batch under theta, its rows split over the devices (padded)."""
        n = batch.label.shape[0]
        pad = -n % self.mesh.shape[AXIS]
        if pad:
            batch = Batch(*(None if x is None else np.concatenate(
                [x, np.zeros((pad, *x.shape[1:]), x.dtype)]) for x in batch))
        mask = batch.mask is not None
        placed = arrays.put_tree(batch, self.mesh, batch_specs(mask))
        if mask not in self._predict_jit:  # a batch's mask is its own (position fields carry
            # one where the spec has no multi-hot field), so its specs are the batch's too
            self._predict_jit[mask] = jax.jit(jax.shard_map(
                self._predict_body, mesh=self.mesh, in_specs=(P(), P(), batch_specs(mask)),
                out_specs=P()))
        return self._predict_jit[mask](params, tables, placed)[:n]

    def _build(self, placed: DilocoState) -> None:
        self._inner_jit = jax.jit(self._inner, donate_argnums=0)
        self._outer_jit = jax.jit(self._outer, donate_argnums=0)
        self._predict_jit: dict[bool, Any] = {}  # by whether the batch has a mask (`predict`)
        cfg = self.setup.cfg
        b = replica_batch(abstract_batch(cfg, self.setup.spec, cfg.train.batch_size), self.k)
        inner = comm.summarize(comm.collectives(self._inner, self.mesh, placed, b))
        outer = comm.summarize(comm.collectives(self._outer, self.mesh, placed))
        self.comm = {"comm_bytes_per_inner_step": inner["comm_bytes_per_step"],
                     "comm_bytes_per_outer_step": outer["comm_bytes_per_step"],
                     "comm_bytes_per_step": inner["comm_bytes_per_step"]
                     + outer["comm_bytes_per_step"] / self.h,
                     "comm_collectives": inner["comm_collectives"] + outer["comm_collectives"]}

    def summary(self) -> dict:
        return {"mesh": dict(self.mesh.shape), "diloco_replicas": self.k,
                "diloco_inner_steps": self.h, "outer_steps": self.outer_steps, **self.comm}


def run(cfg: Config) -> dict:
    """``--algo diloco`` (recjax/registry.py)."""
    return run_spmd(cfg, DilocoSetup, DilocoStrategy)
