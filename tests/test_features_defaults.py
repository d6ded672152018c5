"""Issue 15's training features are off by default and then change nothing: the default step
equals, bit for bit, the step as written before them (lookup -> value_and_grad of the plain
``module.apply({"params"})`` -> optax Adam with a float lr -> SGD scatter of the row
gradients), spelled out here by hand."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from recjax import configs
from recjax.batch import Batch
from recjax.config import Config
from recjax.embeddings import SparseOptimConfig, lookup, row_gradients
from recjax.features import FeatureSpec, FieldSpec
from recjax.models import bce_loss
from recjax.models.config import ModelConfig
from recjax.train.setup import build
from recjax.train.step import jit_train_step

SPEC = FeatureSpec(("d0", "d1"), (FieldSpec("a", 6, table="ac"), FieldSpec("b", 4),
                                  FieldSpec("c", 6, table="ac")))


def _batch(b=8, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.integers(0, 6, b), rng.integers(0, 4, b), rng.integers(0, 6, b)], 1)
    return Batch(rng.normal(size=(b, 2)).astype(np.float32), ids[:, :, None].astype(np.int32),
                 None, (rng.random(b) < 0.5).astype(np.float32))


def _old_step(module, layout, lr_dense, lr_sparse):
    """The pre-issue-15 `train_step`, written out (no microbatching: b = 8 < 512)."""
    tx = optax.adam(lr_dense)

    def step(state, batch):
        acts = lookup(layout, state.tables, batch.ids, batch.mask)

        def loss_fn(p, a):
            logits = module.apply({"params": p}, a, batch.dense)
            return bce_loss(logits, batch.label), logits

        (loss, _), (gp, ga) = jax.value_and_grad(loss_fn, (0, 1), has_aux=True)(state.params, acts)
        updates, opt_state = tx.update(gp, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        rows = row_gradients(layout, ga, batch.ids, batch.mask)
        tables = {n: state.tables[n].at[i].add(-lr_sparse * g, mode="drop")
                  for n, (i, g) in rows.items()}
        return params, opt_state, tables, loss

    return jax.jit(step)


@pytest.mark.parametrize("name", ["dlrm", "deepfm"])
def test_default_step_is_bitwise_the_old_step(name):
    cfg = configs.smoke()
    cfg = dataclasses.replace(cfg, model=ModelConfig.smoke(name),
                              sparse=SparseOptimConfig(name="sgd", lr=0.05),
                              train=dataclasses.replace(cfg.train, microbatches=1))
    assert cfg.dense.name == "adam"
    model, tx, sopt, state = build(cfg, SPEC)
    assert state.batch_stats == ()
    assert not model.train_mode
    old = _old_step(model.module, model.layout, cfg.dense.lr, cfg.sparse.lr)
    new = jit_train_step(model, tx, sopt)
    s_old, s_new = jax.tree.map(np.asarray, state), jax.tree.map(np.asarray, state)
    for k in range(3):
        batch = _batch(seed=k)
        params, opt_state, tables, loss = old(s_old, batch)
        s_new, m = new(s_new, batch)
        s_old = s_old._replace(params=params, opt_state=opt_state, tables=tables)
        assert float(m.loss) == float(loss)
        for a, b in zip(jax.tree.leaves((params, opt_state, tables)),
                        jax.tree.leaves((s_new.params, s_new.opt_state, s_new.tables))):
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_default_config_fields():
    """The defaults that make the features inert."""
    c = Config()
    assert (c.model.dropout, c.model.batch_norm) == (0.0, False)
    assert (c.dense.lr_schedule, c.dense.warmup_steps) == ("constant", 0)
    assert c.sparse.embedding_l2 == 0.0 and c.embed.dims == ""
    assert (c.train.early_stop_patience, c.train.keep_best) == (0, False)
