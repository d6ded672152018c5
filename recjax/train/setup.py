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


# Per row of an LRU store, besides the row and its slots: id and recency (16 B), the map's 4
# positions (64 B), the log (<= 36 B) (recjax/embeddings/dynamic.py).
LRU_ROW_BYTES = 116


def table_bytes(layout, sparse_opt, lru: bool = False) -> dict[str, int]:
    """Bytes of each table with its sparse optimizer slots (and, for an LRU store of that many
    rows, its bookkeeping), from shapes alone (`jax.eval_shape`: nothing is allocated)."""
    out = {}
    for t in layout.tables:
        table = jax.ShapeDtypeStruct((t.num_embeddings, t.embedding_dim), jnp.float32)
        slots = jax.eval_shape(sparse_opt.init, table)
        n = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                for x in jax.tree.leaves((table, slots)))
        out[t.name] = n + (LRU_ROW_BYTES * t.num_embeddings if lru else 0)
    return out


def check_memory(cfg: Config, layout, sparse_opt, lru: bool = False) -> None:
    """Refuse, before allocating, tables and slots larger than the memory this machine has
    available (a 2^28-bucket run was killed by the kernel at 22.9 GB with no message).

    Raises:
      ValueError: the estimate, what is available, and what to lower.
    """
    if not cfg.train.memory_check:
        return
    import psutil

    sizes = table_bytes(layout, sparse_opt, lru)
    need, have = sum(sizes.values()), psutil.virtual_memory().available
    if need <= have:
        return
    big = max(sizes, key=sizes.get)
    rows = next(t.num_embeddings for t in layout.tables if t.name == big)
    gib = 2.0**30
    knob = (f"--embed.capacity (now {cfg.embed.capacity})" if lru
            else f"--data.hash_buckets (now {cfg.data.hash_buckets})")
    raise ValueError(f"the embedding tables and their optimizer slots need {need / gib:,.1f} GiB "
                     f"(largest: {big}, {rows:,} rows, {sizes[big] / gib:,.1f} GiB), more than "
                     f"the {have / gib:,.1f} GiB this machine has available: lower {knob} or "
                     "--model.embed_dim, or a sparse optimizer with fewer slots (--sparse.name "
                     "sgd or rowwise_adagrad); --train.memory_check=false skips this check "
                     "(tables on other hosts)")


def build(cfg: Config, spec: FeatureSpec, tables: bool = True):
    """(model, dense optax tx, sparse optimizer, initial state) for `cfg` on data of `spec`;
    with ``tables=False`` the state's tables and slots are shapes only (`init_state`).

    Raises:
      ValueError: tables and slots beyond this machine's available memory (`check_memory`).
    """
    model = make_model(cfg, spec)
    tx = make_dense_tx(cfg.dense)
    sparse_opt = make_sparse_optimizer(cfg.sparse)
    check_memory(cfg, model.layout, sparse_opt)
    return model, tx, sparse_opt, init_state(cfg, model, spec, tx, sparse_opt, tables)


def count_params(state: TrainState) -> dict:
    dense = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    emb = sum(int(np.prod(x.shape)) for x in state.tables.values())
    return {"dense_params": dense, "embedding_params": emb}
