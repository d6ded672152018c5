"""DES training (Rong et al., SIGIR 2020, Alg. 1): fully synchronous, weights-rich operators split.

    python scripts/train.py --algo des --model deepfm --devices 4 [--spmd.des_placement=balanced]

Mesh axes ``(data, field)``; without ``--mesh`` every device is on ``field``. Each field shard
holds its fields' embedding rows and their slices of the weights-rich operators
(`sharding.des`); the batch is split on ``data`` and every field shard of a data group sees the
same examples (only its own fields' ids: the host sends each shard its slots). One step:

    acts          = lookup(local slots)                        no communication
    loss, g, g_a  = loss_and_grads(DesForward, params, acts)   one reduce-scatter of the partial
                                                               results; upper layers on b/N rows
    params        = apply_dense(tx, params, g / n_data)        split leaves: no all-reduce
    tables        = sparse update of the local rows            no communication

The replicated weights above the substituted layers are trained by each field shard on its
own rows, so their gradients are all-reduced over ``field`` (and ``data``); the split weights
over ``data`` only, as in sync mode. Equal to the single-device step to float rounding (tests/test_des.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from algorithms.sync import SyncStrategy
from recjax.batch import Batch
from recjax.config import Config
from recjax.embeddings import lookup, row_gradients
from recjax.features import FeatureSpec
from recjax.models import embedding_groups
from recjax.train.setup import make_model
from recjax.train.step import TrainState, apply_dense, loss_and_grads, step_metrics
from sharding import arrays, comm, des, embedding, mesh
from sharding.spmd import (
    abstract_batch,
    batch_specs,
    feature_spec,
    global_metrics,
    is_global,
    run_spmd,
)

AXES = ("data", "field")
IDS = P("data", "field")
BASELINE_BATCHES = 8  # batches whose unique ids size the mesh-lookup baseline


@dataclasses.dataclass(frozen=True)
class DesSetup:
    """Mesh and field placement, decided (and checked) before any JAX computation."""

    cfg: Config
    spec: FeatureSpec
    mesh: object
    layout: des.DesLayout

    @property
    def plan(self) -> embedding.EmbeddingPlan:
        return self.layout.plan

    @classmethod
    def from_config(cls, cfg: Config, n_devices: int, spec: FeatureSpec | None = None) -> DesSetup:
        des.check_model(cfg.model.name)
        spec = spec or feature_spec(cfg)
        sizes = mesh.mesh_shape(cfg.spmd.mesh, AXES, n_devices, "field")
        mesh.check_batch(cfg.train.batch_size, sizes["data"])
        dims = tuple(embedding_groups(cfg.model).values())
        assign = des.place_fields(spec, sizes["field"], cfg.spmd.des_placement, dims)
        layout = des.make_layout(make_model(cfg, spec).layout, spec, assign, sizes["field"],
                                 sizes["data"], cfg.model.embed_dim)
        return cls(cfg, spec, mesh.make_mesh(sizes), layout)


class DesStrategy(SyncStrategy):
    """`loop.Strategy` of DES; shares placement and prediction plumbing with sync."""

    name = "des"

    def __init__(self, setup: DesSetup, model, tx, sparse_opt):
        super().__init__(setup, model, tx, sparse_opt)
        self.dl = setup.layout
        self.plan = self.dl.plan
        # DES's forward has collectives over the field axis (the partial results' reduce-scatter,
        # the logits' all-gather, their transposes), and every slice repeats them: auto is one
        # pass. On 8 fake devices, DeepFM B=4096: 75K ex/s one pass vs 63K at auto's 8 slices
        # (32 collectives a step instead of 4); over gloo 66.7K vs 30.1K (docs/performance.md).
        mb = getattr(model, "microbatches", 0) or 1
        self.forward = des.DesForward(setup.cfg.model.name, mb)
        self.model_name = setup.cfg.model.name
        self._unique: list[list[int]] = []

    # -- placement --
    def prepare(self, state: TrainState) -> TrainState:
        if is_global(state):  # a multi-process checkpoint restored onto this mesh
            placed = self.place_restored(state)
            self._build(placed)
            return placed
        host = arrays.fetch(state)
        treedef = jax.tree.structure(host.params)
        split = lambda p: des.split_params(self.dl, self.model_name, p)  # noqa: E731
        params = split(host.params)
        sharded = TrainState(host.step, params, des.map_param_like(split, host.opt_state, treedef),
                             embedding.to_stores(self.plan, host.tables),
                             embedding.to_stores(self.plan, host.slots))
        pspec = des.param_specs(self.model_name, params)
        self.param_treedef = jax.tree.structure(params)
        self.specs = TrainState(P(), pspec, des.map_param_like(lambda _: pspec, sharded.opt_state,
                                                               self.param_treedef, lambda _: P()),
                                embedding.store_specs(self.plan, sharded.tables),
                                embedding.store_specs(self.plan, sharded.slots))
        placed = arrays.put_tree(sharded, self.mesh, self.specs)
        self._build(placed)
        return placed

    # the single-device layout on the devices (`CheckpointLayout`: multi-process checkpoints)
    def _to_logical(self, state: TrainState) -> TrainState:
        join = lambda p: des.join_params(self.dl, self.model_name, p, jnp)  # noqa: E731
        return TrainState(state.step, join(state.params),
                          des.map_param_like(join, state.opt_state, self.param_treedef),
                          embedding.from_stores_jnp(self.plan, state.tables),
                          embedding.from_stores_jnp(self.plan, state.slots))

    def _from_logical(self, state: TrainState) -> TrainState:
        split = lambda p: des.split_params(self.dl, self.model_name, p, jnp)  # noqa: E731
        return TrainState(state.step, split(state.params),
                          des.map_param_like(split, state.opt_state,
                                             jax.tree.structure(state.params)),
                          embedding.to_stores_jnp(self.plan, state.tables),
                          embedding.to_stores_jnp(self.plan, state.slots))

    def _specs_of(self, shapes: TrainState) -> TrainState:
        pspec = des.param_specs(self.model_name, shapes.params)
        self.param_treedef = jax.tree.structure(shapes.params)
        return TrainState(P(), pspec, des.map_param_like(lambda _: pspec, shapes.opt_state,
                                                         self.param_treedef, lambda _: P()),
                          embedding.store_specs(self.plan, shapes.tables),
                          embedding.store_specs(self.plan, shapes.slots))

    def unshard(self, state: TrainState) -> TrainState:
        host = arrays.fetch(state)
        join = lambda p: des.join_params(self.dl, self.model_name, p)  # noqa: E731
        return TrainState(host.step, join(host.params),
                          des.map_param_like(join, host.opt_state, self.param_treedef),
                          embedding.from_stores(self.plan, host.tables),
                          embedding.from_stores(self.plan, host.slots))

    def put_batch(self, batch: Batch) -> Batch:
        if len(self._unique) < BASELINE_BATCHES:
            tables = [f.table for f in self.setup.spec.fields]
            self._unique.append(comm.unique_per_worker(batch.ids, self.mesh.size, tables, batch.mask))
        return self._place(batch)

    def _place(self, batch: Batch) -> Batch:
        ids, m = des.des_ids(self.dl, batch.ids, batch.mask)
        return arrays.put_tree(Batch(batch.dense, ids, m, batch.label), self.mesh,
                               batch_specs(True, IDS))

    # -- the step --
    def _body(self, params, tables, slots, step, batch):
        nd, local = self.n_data, self.dl.local
        acts = lookup(local, tables, batch.ids, batch.mask)
        (loss, logits), (g_p, g_a) = loss_and_grads(self.forward, params, acts, batch)
        g_p = jax.tree.map(lambda g: g / nd, g_p)  # autodiff summed over data (see sync)
        gather = lambda x: jax.lax.all_gather(x, "data", axis=0, tiled=True, to="invarying")  # noqa: E731
        rows = row_gradients(local, {k: gather(v / nd) for k, v in g_a.items()},
                             gather(batch.ids), gather(batch.mask))
        new_t, new_s = {}, {}
        for name, (ids, grads) in rows.items():
            new_t[name], new_s[name] = self.opt.update(tables[name], slots[name], ids, grads, step)
        return g_p, new_t, new_s, global_metrics(step_metrics(loss, logits, batch.label))

    def _step(self, state: TrainState, batch: Batch):
        s = self.specs
        g_p, tables, slots, metrics = jax.shard_map(
            self._body, mesh=self.mesh,
            in_specs=(s.params, s.tables, s.slots, P(), batch_specs(True, IDS)),
            out_specs=(s.params, s.tables, s.slots, P()),
        )(state.params, state.tables, state.slots, state.step, batch)
        params, opt_state = apply_dense(self.tx, state.params, state.opt_state, g_p)
        return TrainState(state.step + 1, params, opt_state, tables, slots), metrics

    def _predict_body(self, params, tables, batch):
        acts = lookup(self.dl.local, tables, batch.ids, batch.mask)
        logits = self.forward.logits(params, acts, batch.dense)
        return jax.lax.all_gather(logits, "data", axis=0, tiled=True, to="invarying")

    def _predict(self, params, tables, batch):
        return jax.shard_map(self._predict_body, mesh=self.mesh,
                             in_specs=(self.specs.params, self.specs.tables, batch_specs(True, IDS)),
                             out_specs=P())(params, tables, batch)

    def _abstract_batch(self) -> Batch:
        cfg, dl = self.setup.cfg, self.dl
        b = abstract_batch(cfg, self.setup.spec, cfg.train.batch_size)
        ids = jax.ShapeDtypeStruct((b.ids.shape[0], dl.n * dl.fs, b.ids.shape[2]), np.int32)
        return Batch(b.dense, ids, jax.ShapeDtypeStruct(ids.shape, np.float32), b.label)

    def summary(self) -> dict:
        dims = [d for _, d in self.dl.local.groups]
        base = [comm.mesh_lookup_bytes(u, self.mesh.size, dims) for u in self._unique]
        return {"mesh": dict(self.mesh.shape), "des_placement": self.setup.cfg.spmd.des_placement,
                "des_fields_per_shard": np.bincount(
                    [k // self.dl.fs for k, f in enumerate(self.dl.slot_field) if f >= 0],
                    minlength=self.dl.n).tolist(),
                **self.comm,
                "comm_baseline_bytes_per_step": float(np.mean(base)) if base else None}


def run(cfg: Config) -> dict:
    """`algorithms.RUNNERS["des"]`."""
    return run_spmd(cfg, DesSetup, DesStrategy)
