"""Shared fixtures of the SPMD tests (sync, DES): tiny configs, batches, the reference step.

Rank-coded tables (maxtext style): row r of table t holds ``1000 t + r + d / 8`` in column d
(exact in float32, and so are sums of a few), so an activation looked up from a misplaced shard,
row or column differs *exactly*.
"""

import dataclasses

import jax
import numpy as np

from recjax import configs
from recjax.batch import Batch
from recjax.config import DenseOptimConfig, SpmdConfig
from recjax.embeddings import SparseOptimConfig
from recjax.features import FeatureSpec, FieldSpec
from recjax.models.config import ModelConfig
from recjax.train.setup import build
from recjax.train.step import jit_train_step

# Fields a and c share a table; b is multi-hot (L = 3) in MULTI_HOT.
ONE_HOT = FeatureSpec(("d0", "d1"), (FieldSpec("a", 13, table="ac"), FieldSpec("b", 7),
                                      FieldSpec("c", 13, table="ac"), FieldSpec("e", 21),
                                      FieldSpec("f", 5)))
MULTI_HOT = FeatureSpec(("d0",), (FieldSpec("a", 13, table="ac"), FieldSpec("b", 7, max_len=3),
                                  FieldSpec("c", 13, table="ac"), FieldSpec("e", 21)))


def tiny_cfg(model: str, *, mesh: str = "", rules: str = "", placement: str = "round_robin",
             sparse: str = "adagrad", pooling: str = "sum", batch: int = 16,
             route_capacity: float = 1.25):
    cfg = configs.smoke()
    return dataclasses.replace(
        cfg, model=ModelConfig(name=model, embed_dim=8, bottom_mlp=(4,), top_mlp=(5,),
                               deep_mlp=(6, 4), cross_layers=2),
        dense=DenseOptimConfig(name="adam", lr=0.01),
        sparse=SparseOptimConfig(name=sparse, lr=0.1),
        embed=dataclasses.replace(cfg.embed, init="0.5", pooling=pooling),
        train=dataclasses.replace(cfg.train, batch_size=batch),
        spmd=SpmdConfig(mesh=mesh, table_rules=rules, des_placement=placement,
                        route_capacity=route_capacity))


def random_batch(spec: FeatureSpec, b: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    ids = np.zeros((b, spec.n_fields, spec.max_len), np.int32)
    mask = np.zeros(ids.shape, np.float32) if spec.multi_hot else None
    for f, field in enumerate(spec.fields):
        ids[:, f, :] = rng.integers(0, field.vocab_size, (b, spec.max_len))
        if mask is not None:
            n = rng.integers(0 if field.max_len > 1 else 1, field.max_len + 1, b)
            mask[:, f, :] = np.arange(spec.max_len)[None, :] < n[:, None]
    return Batch(rng.normal(size=(b, spec.n_dense)).astype(np.float32), ids, mask,
                 (rng.random(b) < 0.5).astype(np.float32))


def rank_coded(state):
    """`state` with table t's row r, column d set to ``1000 t + r + d / 8``."""
    tables = {}
    for t, (name, x) in enumerate(sorted(state.tables.items())):
        v, d = x.shape
        tables[name] = (1000.0 * (t + 1) + np.arange(v)[:, None] + np.arange(d)[None, :] / 8.0
                        ).astype(np.float32)
    return state._replace(tables=tables)


def build_spec(cfg, spec: FeatureSpec):
    return build(cfg, spec)


def reference_steps(model, tx, sopt, state, batches):
    step = jit_train_step(model, tx, sopt)
    state = jax.tree.map(np.asarray, state)
    metrics = []
    for b in batches:
        state, m = step(state, b)
        metrics.append(m)
    return jax.tree.map(np.asarray, state), metrics


def assert_states_close(ref, got, rtol: float, atol: float):
    """Params, optimizer state, tables and slots of two single-device-layout states."""
    for part in ("params", "opt_state", "tables", "slots"):
        a = jax.tree_util.tree_flatten_with_path(getattr(ref, part))[0]
        b = jax.tree.leaves(getattr(got, part))
        assert len(a) == len(b), part
        for (path, x), y in zip(a, b):
            np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=rtol, atol=atol,
                                       err_msg=f"{part}{jax.tree_util.keystr(path)}")
