"""recjax/embeddings/sparse_optim.py: the cases mutation testing found unpinned (docs/testing.md).

Expected values are computed by hand (written in the docstrings) or by the float64 numpy
references of tests/test_sparse_optim_props.py; each docstring names the mutant it kills.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recjax.embeddings import SparseOptimConfig, make_sparse_optimizer
from tests.test_sparse_optim_props import D, N, V, reference


# not ftrl: its reference calls hypothesis' assume (a property-test helper) at the l1 threshold
@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_updates_run_under_jit(name):
    """Every update is jit-friendly (fixed-size `coalesce`, as its docstring says) and, jitted,
    equals the paper's update written in numpy. Kills ``n = ids.shape[0] -> n = None`` in
    coalesce (sparse_optim.py:81): eagerly ``jnp.unique`` then sizes itself, under jit it cannot.

    Ids repeat (2 three times) and include padding (V, V + 2).
    """
    cfg = SparseOptimConfig(name=name, lr=0.1, initial_accumulator=0.1)
    rng = np.random.default_rng(0)
    table = rng.uniform(-1, 1, (V, D)).astype(np.float32)
    steps = [(np.array([2, 0, 2, V, 5, 2, V + 2, 1, 0, V]),
              rng.normal(size=(N, D)).astype(np.float32)) for _ in range(2)]
    opt = make_sparse_optimizer(cfg)
    update = jax.jit(opt.update)
    w, slots = jnp.asarray(table), opt.init(jnp.asarray(table))
    for step, (ids, grads) in enumerate(steps):
        w, slots = update(w, slots, jnp.asarray(ids, jnp.int32), jnp.asarray(grads), jnp.int32(step))
    want_w, want_slots = reference(cfg, table, steps)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5, atol=1e-6)
    for got, want in zip(jax.tree.leaves(slots), want_slots):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,delta", [
    # a = 12.5 (mean of 9 and 16), w -= g / (sqrt(12.5) + 1) = [3, 4] / 4.5355339
    ("rowwise_adagrad", [0.66144363, 0.88192484]),
    # a = g^2 per coordinate, w -= g / (|g| + 1) = [3/4, 4/5]
    ("adagrad", [0.75, 0.8]),
])
def test_adagrad_eps_is_added_to_the_root(name, delta):
    """eps = 1 (large enough to see): ``w -= lr g / (sqrt(a) + eps)``. Kills ``+ cfg.eps ->
    - cfg.eps`` (sparse_optim.py:131; eps = 1e-8 hides inside a 1e-5 tolerance)."""
    cfg = SparseOptimConfig(name=name, lr=1.0, eps=1.0)
    opt = make_sparse_optimizer(cfg)
    table = jnp.zeros((3, 2))
    w, _ = opt.update(table, opt.init(table), jnp.array([1], jnp.int32),
                      jnp.array([[3.0, 4.0]]), jnp.int32(0))
    np.testing.assert_allclose(np.asarray(w), [[0, 0], [-delta[0], -delta[1]], [0, 0]], rtol=1e-6)


@pytest.mark.parametrize("lr", [0.0, -0.1])
def test_learning_rate_must_be_positive(lr):
    """lr = 0 trains nothing and is refused like a negative one (kills ``lr <= 0 -> lr < 0``,
    sparse_optim.py:68)."""
    with pytest.raises(ValueError, match="sparse.lr must be > 0"):
        SparseOptimConfig(name="sgd", lr=lr)
