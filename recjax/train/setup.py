"""Build a run's pieces from its config: model, optimizers, initial state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from recjax.config import Config, DenseOptimConfig
from recjax.embeddings import init_tables, make_layout, make_sparse_optimizer
from recjax.features import FeatureSpec
from recjax.models import build_model, embedding_groups
from recjax.train.features import check_features, table_dims
from recjax.train.schedules import dense_schedule
from recjax.train.step import Model, TrainState


def make_dense_tx(cfg: DenseOptimConfig) -> optax.GradientTransformation:
    """The dense optimizer as an optax chain (optional global-norm clipping first), its learning
    rate under ``cfg.lr_schedule`` (recjax/train/schedules.py)."""
    lr = dense_schedule(cfg)  # the float dense.lr itself unless a schedule or warm-up is set
    if cfg.name == "sgd":
        tx = optax.sgd(lr)
    elif cfg.name == "momentum":
        tx = optax.sgd(lr, momentum=cfg.b1)
    elif cfg.name == "adam":
        tx = optax.adam(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    elif cfg.name == "adamw":
        tx = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    else:
        tx = optax.adagrad(lr, eps=cfg.eps)
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx) if cfg.clip_norm > 0 else tx


def make_model(cfg: Config, spec: FeatureSpec) -> Model:
    check_features(cfg)
    dims = (table_dims(cfg.embed.dims, dict.fromkeys(f.table for f in spec.fields),
                       cfg.model.embed_dim) if cfg.embed.dims else None)
    layout = make_layout(spec, embedding_groups(cfg.model), pooling=cfg.embed.pooling, dims=dims)
    return Model(module=build_model(cfg.model, spec), layout=layout,
                 microbatches=cfg.train.microbatches, seed=cfg.train.seed)


def init_state(cfg: Config, model: Model, spec: FeatureSpec, tx, sparse_opt,
               tables: bool = True) -> TrainState:
    """Initial parameters, tables and optimizer states (seeded by ``train.seed``).

    With ``tables=False`` the tables and their slots are `jax.ShapeDtypeStruct`\\ s: their
    owner initialises them elsewhere (a Ray PS shard, from the same `init_tables`), and the
    state still serves as a checkpoint's template.
    """
    b = 2
    acts = {g: jnp.zeros((b, spec.n_fields, d), jnp.float32) for g, d in model.layout.groups}
    dense = jnp.zeros((b, spec.n_dense), jnp.float32)
    variables = model.module.init(jax.random.PRNGKey(cfg.train.seed), acts, dense)
    params = variables["params"]
    if tables:
        tabs = {k: jnp.asarray(v) for k, v in init_tables(
            model.layout, cfg.train.seed, init_scale(cfg), by_id=cfg.embed.init_by_id).items()}
        slots = {k: sparse_opt.init(v) for k, v in tabs.items()}
    else:
        tabs = {t.name: jax.ShapeDtypeStruct((t.num_embeddings, t.embedding_dim), jnp.float32)
                for t in model.layout.tables}
        slots = {k: jax.eval_shape(sparse_opt.init, v) for k, v in tabs.items()}
    return TrainState(jnp.asarray(0, jnp.int32), params, tx.init(params), tabs, slots,
                      variables.get("batch_stats", ()))


def init_scale(cfg: Config) -> str | float:
    """``embed.init`` as `init_tables` takes it: ``"dlrm"`` or the normal's scale."""
    return cfg.embed.init if cfg.embed.init == "dlrm" else float(cfg.embed.init)


def build(cfg: Config, spec: FeatureSpec, tables: bool = True):
    """(model, dense optax tx, sparse optimizer, initial state) for `cfg` on data of `spec`;
    with ``tables=False`` the state's tables and slots are shapes only (`init_state`)."""
    model = make_model(cfg, spec)
    tx = make_dense_tx(cfg.dense)
    sparse_opt = make_sparse_optimizer(cfg.sparse)
    return model, tx, sparse_opt, init_state(cfg, model, spec, tx, sparse_opt, tables)


def count_params(state: TrainState) -> dict:
    dense = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    emb = sum(int(np.prod(x.shape)) for x in state.tables.values())
    return {"dense_params": dense, "embedding_params": emb}
