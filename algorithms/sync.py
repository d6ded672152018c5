"""Fully synchronous SPMD training on a device mesh (the data-parallel + sharded-table baseline).

    python scripts/train.py --algo sync --devices 8 --mesh data=4,model=2 \\
        --spmd.table_rules="emb/C1:table_wise;wide/.*:data_parallel;.*:row_wise"

Dense params replicated, the batch split on ``data``, every embedding table placed by the rule
table (`sharding.rules`) on the ``model`` axis, or, on a 1-D mesh (no ``--mesh``: all devices on
``data``), on the data axis itself, torchrec style. One step is the single-device
`recjax.train.step.train_step` with its pieces rearranged (maxtext's "wrap the local step"):

    acts             = sharded_lookup(tables, ids)                   reduce-scatter, table axis
    loss, g_p, g_a   = loss_and_grads(model, params, acts, batch)    own rows; g_p all-reduced
    params           = apply_dense(tx, params, g_p / n)              replicated, identical
    tables           = sharded_update(tables, all_gather(ids, g_a))  each device its own rows

On a 2-D mesh the lookup hands each ``model`` shard its own half (quarter, ...) of the data
shard's examples (`embedding.split_rows`), so no two devices run the dense network on the same
rows; n is then the number of devices, else the size of ``data``. The trajectory equals the
single-device one on the same global batch (tests/test_sync.py).
`sharding.spmd.run_spmd` (shared with DES) does the runtime set-up, multi-process output and
final-state dump.
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P

from recjax.batch import Batch
from recjax.config import Config
from recjax.features import FeatureSpec
from recjax.train.data import process_rows
from recjax.train.setup import make_model
from recjax.train.step import (
    TrainState,
    apply_dense,
    loss_and_grads,
    loss_and_grads_train,
    step_metrics,
    step_rng,
)
from sharding import arrays, comm, embedding, mesh, routing, rules
from sharding.spmd import (
    CheckpointLayout,
    abstract_batch,
    batch_specs,
    feature_spec,
    gather,
    global_metrics,
    is_global,
    run_spmd,
)

AXES = ("data", "model")
ROUTE_CHECKS = 8  # first batches checked against the routing capacity on the host


@dataclasses.dataclass(frozen=True)
class SyncSetup:
    """Everything decided from the config before any JAX computation (so errors come first)."""

    cfg: Config
    spec: FeatureSpec
    mesh: object
    plan: embedding.EmbeddingPlan

    @classmethod
    def from_config(cls, cfg: Config, n_devices: int, spec: FeatureSpec | None = None) -> SyncSetup:
        spec = spec or feature_spec(cfg)
        sizes = mesh.mesh_shape(cfg.spmd.mesh, AXES, n_devices, "data")
        mesh.check_batch(cfg.train.batch_size, sizes["data"])
        layout = make_model(cfg, spec).layout
        kinds = rules.resolve(rules.parse_rules(cfg.spmd.table_rules),
                              [t.name for t in layout.tables], "row_wise")
        axis = "model" if sizes["model"] > 1 else "data"
        plan = embedding.make_plan(layout, kinds, axis, sizes[axis], "data", sizes["data"],
                                   cfg.sparse.name)
        return cls(cfg, spec, mesh.make_mesh(sizes), plan)


class SyncStrategy(CheckpointLayout):
    """`loop.Strategy` of the sync algorithm on ``setup.mesh``."""

    name = "sync"

    def __init__(self, setup: SyncSetup, model, tx, sparse_opt):
        self.setup, self.model, self.tx, self.opt = setup, model, tx, sparse_opt
        self.mesh, self.plan = setup.mesh, setup.plan
        self.n_data = self.mesh.shape["data"]
        self.comm: dict = {}
        self._route_over: list[bool] = []

    # -- placement --
    def _specs(self, state: TrainState) -> TrainState:
        return TrainState(P(), P(), P(), embedding.store_specs(self.plan, state.tables),
                          embedding.store_specs(self.plan, state.slots), P())

    def prepare(self, state: TrainState) -> TrainState:
        if is_global(state):  # a multi-process checkpoint restored onto this mesh
            placed = self.place_restored(state)
            self._build(placed)
            return placed
        host = arrays.fetch(state)
        sharded = TrainState(host.step, host.params, host.opt_state,
                             embedding.to_stores(self.plan, host.tables),
                             embedding.to_stores(self.plan, host.slots), host.batch_stats)
        self.specs = self._specs(sharded)
        placed = arrays.put_tree(sharded, self.mesh, self.specs)
        self._build(placed)
        return placed

    def unshard(self, state: TrainState) -> TrainState:
        """The state in the single-device layout, as host numpy (a collective across processes)."""
        host = arrays.fetch(state)
        return TrainState(host.step, host.params, host.opt_state,
                          embedding.from_stores(self.plan, host.tables),
                          embedding.from_stores(self.plan, host.slots), host.batch_stats)

    # the single-device layout on the devices (`CheckpointLayout`: multi-process checkpoints)
    def _to_logical(self, state: TrainState) -> TrainState:
        return TrainState(state.step, state.params, state.opt_state,
                          embedding.from_stores_jnp(self.plan, state.tables),
                          embedding.from_stores_jnp(self.plan, state.slots), state.batch_stats)

    def _from_logical(self, state: TrainState) -> TrainState:
        return TrainState(state.step, state.params, state.opt_state,
                          embedding.to_stores_jnp(self.plan, state.tables),
                          embedding.to_stores_jnp(self.plan, state.slots), state.batch_stats)

    def _specs_of(self, shapes: TrainState) -> TrainState:
        return self._specs(shapes)

    def put_batch(self, batch: Batch) -> Batch:
        if len(self._route_over) < ROUTE_CHECKS:
            self._check_route(batch)
        return self._place(batch)

    def _check_route(self, batch: Batch) -> None:
        """Count, on the first batches, the steps that exceed the routing capacity (they take
        the exact but slower masked path), and say so once.

        In a multi-process run a process holds only its block of each global batch (the other
        rows zero, `recjax.train.data.block_batches`): it checks the routing sources inside its
        block, and `summary` joins the processes' flags (a step is over capacity where any
        source is)."""
        plan, factor = self.plan, self.setup.cfg.spmd.route_capacity
        n = batch.label.shape[0]
        if not routing.routable(plan, factor, n // self.n_data):
            return
        split = not plan.same_axis
        sources = self.n_data * (plan.n_shards if split else 1)  # contiguous slices of the batch
        ids, mask = batch.ids, batch.mask
        rows = process_rows(self, n)
        if rows is not None:  # this process's block: whole sources (the data axis's shards)
            ids, mask = ids[rows], None if mask is None else mask[rows]
            sources = sources * (rows.stop - rows.start) // n
        over = routing.host_over(plan, ids, mask, factor, sources)
        if over and not any(self._route_over):
            print(f"note: a batch exceeds the id-routing capacity (spmd.route_capacity={factor}); "
                  "such steps take the exact, slower masked path. summary.json counts them "
                  "(route_over_capacity); a larger --spmd.route_capacity avoids them",
                  file=sys.stderr, flush=True)
        self._route_over.append(over)

    def _place(self, batch: Batch) -> Batch:
        return arrays.put_tree(batch, self.mesh, batch_specs(batch.mask is not None))

    # -- the step --
    def _body(self, params, tables, slots, step, batch, batch_stats=()):
        plan, factor = self.plan, self.setup.cfg.spmd.route_capacity
        b = batch.label.shape[0]
        split = embedding.split_rows(plan, b)
        mine = (lambda x: embedding.my_rows(plan, x)) if split else (lambda x: x)  # noqa: E731
        axes = ("data", plan.axis) if split else ("data",)
        n = self.n_data * (plan.n_shards if split else 1)  # shards of the global batch
        w = embedding.pool_weights(plan, batch.ids, batch.mask)
        rows = ([s for s in plan.stores if s.kind == "rows"] if routing.routable(plan, factor, b)
                else [])
        routes = {s.key: routing.make_route(plan, s, mine(batch.ids), mine(w), factor)
                  for s in rows}
        # a (source, owner) pair over capacity anywhere: this step takes the masked path
        over = jnp.any(jnp.stack([r.over for r in routes.values()])) if routes else None
        branch = (lambda masked, routed: jax.lax.cond(over, masked, routed)) if routes else (  # noqa: E731
            lambda masked, routed: masked())

        def masked_acts(routed=None):
            return embedding.sharded_lookup(plan, tables, batch.ids, batch.mask, split, routed)

        def routed_acts():
            return masked_acts({s.key: routing.lookup(plan, s, tables[s.key], routes[s.key],
                                                      b // (plan.n_shards if split else 1))
                                for s in rows})

        acts = branch(masked_acts, routed_acts)
        local = Batch(mine(batch.dense), batch.ids, batch.mask, mine(batch.label))
        if self.model.train_mode:
            # Dropout: each batch shard its own masks (the key folded with the shard's index).
            # Batch norm: each shard normalises with its own rows' statistics (PyTorch DDP's
            # BatchNorm, not SyncBatchNorm); the running averages are then averaged over the
            # shards so every replica holds the same ones.
            rng = jax.random.fold_in(step_rng(self.model.seed, step), jax.lax.axis_index(axes))
            (loss, logits), (g_p, g_a), batch_stats = loss_and_grads_train(
                self.model, params, batch_stats, acts, local, rng)
            batch_stats = jax.tree.map(lambda x: jax.lax.pmean(x, axes), batch_stats)
        else:
            (loss, logits), (g_p, g_a) = loss_and_grads(self.model, params, acts, local)
        # shard_map's autodiff already summed g_p over the batch shards (transpose of pvary);
        # each shard differentiated its local mean, so / n gives the global mean's grad.
        g_p = jax.tree.map(lambda g: g / n, g_p)
        g_a = {k: v / n for k, v in g_a.items()}

        def masked_update(routed=None):
            return embedding.sharded_update(
                plan, self.opt, tables, slots, gather(batch.ids), gather(w),
                {k: gather(v, axes) for k, v in g_a.items()}, step, routed)

        def routed_update():
            done = {s.key: routing.update(plan, self.opt, s, tables[s.key], slots[s.key],
                                          routes[s.key], g_a[s.group], step) for s in rows}
            if len(rows) < len(plan.stores):
                return masked_update(done)
            return {k: v[0] for k, v in done.items()}, {k: v[1] for k, v in done.items()}

        tables, slots = branch(masked_update, routed_update)
        return (g_p, tables, slots, global_metrics(step_metrics(loss, logits, local.label), axes),
                batch_stats)

    def _step(self, state: TrainState, batch: Batch):
        s = self.specs
        mask = batch.mask is not None
        g_p, tables, slots, metrics, stats = jax.shard_map(
            self._body, mesh=self.mesh,
            in_specs=(P(), s.tables, s.slots, P(), batch_specs(mask), P()),
            out_specs=(P(), s.tables, s.slots, P(), P()),
        )(state.params, state.tables, state.slots, state.step, batch, state.batch_stats)
        params, opt_state = apply_dense(self.tx, state.params, state.opt_state, g_p)
        return TrainState(state.step + 1, params, opt_state, tables, slots, stats), metrics

    def _predict_body(self, params, tables, batch):
        acts = embedding.sharded_lookup(self.plan, tables, batch.ids, batch.mask)
        logits = self.model.logits(params, acts, batch.dense)
        return jax.lax.all_gather(logits, "data", axis=0, tiled=True, to="invarying")

    def _predict(self, params, tables, batch):
        s = self.specs
        return jax.shard_map(self._predict_body, mesh=self.mesh,
                             in_specs=(P(), s.tables, batch_specs(batch.mask is not None)),
                             out_specs=P())(params, tables, batch)

    def _build(self, placed: TrainState) -> None:
        self.train_step = jax.jit(self._step, donate_argnums=0)
        self._predict_jit = jax.jit(self._predict)
        self.comm = comm.summarize(comm.collectives(self._step, self.mesh, placed,
                                                    self._abstract_batch()))

    def _abstract_batch(self) -> Batch:
        cfg = self.setup.cfg
        return abstract_batch(cfg, self.setup.spec, cfg.train.batch_size)

    def predict(self, params, tables, batch: Batch):
        """Logits of a host batch, padded to a multiple of the data axis (eval batches)."""
        n = batch.label.shape[0]
        pad = -n % self.n_data
        if pad:
            batch = Batch(*(None if x is None else np.concatenate([x, np.zeros((pad,) + x.shape[1:],
                                                                               x.dtype)])
                            for x in batch))
        return self._predict_jit(params, tables, self._place(batch))[:n]

    def summary(self) -> dict:
        out = {"mesh": dict(self.mesh.shape), "table_axis": self.plan.axis,
               "table_sharding": self.plan.kinds, **self.comm}
        if self._route_over:
            over = np.asarray(self._route_over, np.int32)
            if jax.process_count() > 1:  # (every process calls this) each checked its block
                over = np.any(multihost_utils.process_allgather(over), axis=0)
            out["route_capacity"] = self.setup.cfg.spmd.route_capacity
            out["route_over_capacity"] = {"checked_batches": len(self._route_over),
                                          "over": int(np.sum(over))}
        return out


def run(cfg: Config) -> dict:
    """`algorithms.RUNNERS["sync"]`."""
    return run_spmd(cfg, SyncSetup, SyncStrategy)
