"""Sparse (row-wise) optimizers for embedding tables, optax-style pairs of pure functions.

A `SparseOptimizer` updates only the rows a batch touched. Its state ("slots") lives beside the
rows: arrays with the table's leading dimension, so sharding a table shards its slots the same
way. Each optimizer takes the (ids, per-entry gradients) of `tables.row_gradients`:

* SGD scatter-adds every entry directly, so no sort is needed (PERF_NOTES pitfall 2:
  deduplicating first is slower on CPU). Duplicates are *not* summed exactly: each entry's
  ``-lr * g`` is added into the float32 row on its own, and each addition rounds to the row's
  magnitude, so an id repeated n times in a batch carries up to ~n half-ulps of the row (summing
  the entries first, as the optimizers below do, rounds small numbers against each other
  instead). It matters only for ids repeated hundreds of times in one batch.
* Adagrad, row-wise Adagrad, Adam and FTRL are non-linear in the row gradient, so they first
  merge duplicate ids into one exact per-row sum (`coalesce`), then update each touched row once,
  exactly as a dense optimizer would on the dense gradient restricted to those rows.

Out-of-range ids (``>= V``, used for padding) are dropped by every scatter (``mode="drop"``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp

from recjax.config_fields import check_choices


class SparseOptimizer(NamedTuple):
    """Attributes:
      init: ``table f32[V, D] -> slots`` (a pytree of arrays with leading dim V, or ()).
      update: ``(table, slots, ids i32[N], grads f32[N, D], step i32) -> (table, slots)``;
        ``step`` counts updates from 0 (Adam's bias correction needs it).
    """

    init: Callable[[jax.Array], Any]
    update: Callable[..., tuple[jax.Array, Any]]


@dataclasses.dataclass(frozen=True)
class SparseOptimConfig:
    """Embedding optimizer settings.

    Attributes:
      name: sgd | adagrad | rowwise_adagrad | adam | ftrl.
      lr: learning rate (FTRL's alpha).
      eps: Adagrad/Adam denominator epsilon.
      initial_accumulator: Adagrad's starting accumulator value.
      b1: Adam first-moment decay.
      b2: Adam second-moment decay.
      l1: FTRL L1 strength.
      l2: FTRL L2 strength.
      beta: FTRL beta.
      embedding_l2: lambda of the L2 penalty ``lambda/2 * sum_r ||w_r||^2`` over the rows r a
        step touches (`with_l2`; FuxiCTR's ``embedding_regularizer``); applies to every
        table, wide (dim-1) tables included, under any optimizer (on top of FTRL's own l2).
        0 = off.
    """

    # the keys of SPARSE_OPTIMIZERS (defined below: the annotation is read when a config is made)
    name: Literal[SPARSE_NAMES] = dataclasses.field(
        default="sgd", metadata={"unknown": "sparse optimizer"})
    lr: float = 0.05
    eps: float = 1e-8
    initial_accumulator: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    l1: float = 0.0
    l2: float = 0.0
    beta: float = 1.0
    embedding_l2: float = 0.0

    def __post_init__(self):
        check_choices(self, "sparse")
        if self.lr <= 0:
            raise ValueError(f"sparse.lr must be > 0, got {self.lr}")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"sparse.{name} must be in [0, 1), got {getattr(self, name)}")
        if not (math.isfinite(self.embedding_l2) and self.embedding_l2 >= 0):
            raise ValueError(f"sparse.embedding_l2 must be >= 0 (0 = off), got {self.embedding_l2}")


def coalesce(ids: jax.Array, grads: jax.Array, num_rows: int) -> tuple[jax.Array, jax.Array]:
    """Merge duplicate ids: ``(unique ids i32[N], summed grads f32[N, D])``.

    Fixed size N (jit-friendly): unused slots carry id ``num_rows`` (out of range, dropped by the
    scatters) and zero gradient. The sums are exact: every entry lands in its id's segment.
    """
    n = ids.shape[0]
    uniq, inv = jnp.unique(ids, size=n, fill_value=num_rows, return_inverse=True)
    summed = jax.ops.segment_sum(grads, inv.reshape(-1), num_segments=n)
    return uniq, summed


def _rows(a: jax.Array, ids: jax.Array) -> jax.Array:
    return jnp.take(a, ids, axis=0, mode="clip")


def _set(a: jax.Array, ids: jax.Array, v: jax.Array) -> jax.Array:
    return a.at[ids].set(v, mode="drop")


def sgd(cfg: SparseOptimConfig) -> SparseOptimizer:
    """w_r <- w_r - lr * sum of the batch's gradients for row r."""

    def update(table, slots, ids, grads, step):
        del step
        return table.at[ids].add(-cfg.lr * grads, mode="drop"), slots

    return SparseOptimizer(lambda table: (), update)


def adagrad(cfg: SparseOptimConfig) -> SparseOptimizer:
    """Per-coordinate Adagrad (Duchi et al. 2011): ``a += G^2; w -= lr * G / (sqrt(a) + eps)``,
    ``a`` starting at ``initial_accumulator`` (default 0). The dense Adagrad (``--dense.name
    adagrad``) is optax's, which differs in both: its accumulator starts at 0.1 and its eps is
    inside the root, ``G / sqrt(a + eps)``; the two are not meant to agree."""

    def init(table):
        return jnp.full_like(table, cfg.initial_accumulator)

    def update(table, acc, ids, grads, step):
        del step
        ids, g = coalesce(ids, grads, table.shape[0])
        a = _rows(acc, ids) + g * g
        w = _rows(table, ids) - cfg.lr * g / (jnp.sqrt(a) + cfg.eps)
        return _set(table, ids, w), _set(acc, ids, a)

    return SparseOptimizer(init, update)


def rowwise_adagrad(cfg: SparseOptimConfig) -> SparseOptimizer:
    """Row-wise Adagrad (one accumulator per row, as in DLRM/FBGEMM): ``a_r += mean_d G_rd^2``."""

    def init(table):
        return jnp.full(table.shape[:1], cfg.initial_accumulator, table.dtype)

    def update(table, acc, ids, grads, step):
        del step
        ids, g = coalesce(ids, grads, table.shape[0])
        a = _rows(acc, ids) + jnp.mean(g * g, axis=1)
        w = _rows(table, ids) - cfg.lr * g / (jnp.sqrt(a)[:, None] + cfg.eps)
        return _set(table, ids, w), _set(acc, ids, a)

    return SparseOptimizer(init, update)


def _one_minus_power(b: float, t: jax.Array) -> jax.Array:
    """``1 - b^t`` as ``-expm1(t log b)``: in float32, 1 - 0.999 would lose ~4 digits to
    cancellation. ``b = 0`` (Adam without momentum) is 1: log(0) has no float value."""
    return jnp.ones_like(t) if b == 0 else -jnp.expm1(t * math.log(b))


def adam(cfg: SparseOptimConfig) -> SparseOptimizer:
    """Lazy Adam (Kingma & Ba 2015, Alg. 1 applied to touched rows only, like TF's LazyAdam).

    Moments of untouched rows do not decay; the bias correction uses the global step t.
    """

    def init(table):
        return (jnp.zeros_like(table), jnp.zeros_like(table))

    def update(table, slots, ids, grads, step):
        m_all, v_all = slots
        ids, g = coalesce(ids, grads, table.shape[0])
        t = (step + 1).astype(table.dtype)
        m = cfg.b1 * _rows(m_all, ids) + (1 - cfg.b1) * g
        v = cfg.b2 * _rows(v_all, ids) + (1 - cfg.b2) * g * g
        m_hat = m / _one_minus_power(cfg.b1, t)
        v_hat = v / _one_minus_power(cfg.b2, t)
        w = _rows(table, ids) - cfg.lr * m_hat / (jnp.sqrt(v_hat) + cfg.eps)
        return _set(table, ids, w), (_set(m_all, ids, m), _set(v_all, ids, v))

    return SparseOptimizer(init, update)


def ftrl(cfg: SparseOptimConfig) -> SparseOptimizer:
    """FTRL-Proximal, per coordinate (McMahan et al., KDD 2013, Algorithm 1).

    sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma * w;  n += g^2;
    w = 0 if |z| <= l1 else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2).
    The slots are (z, n); the table holds w. Starting from w = 0 reproduces the paper exactly;
    from a random init, the first update moves w as the formula says.
    """

    def init(table):
        return (jnp.zeros_like(table), jnp.zeros_like(table))

    def update(table, slots, ids, grads, step):
        del step
        z_all, n_all = slots
        ids, g = coalesce(ids, grads, table.shape[0])
        w, z, n = _rows(table, ids), _rows(z_all, ids), _rows(n_all, ids)
        n_new = n + g * g
        sigma = (jnp.sqrt(n_new) - jnp.sqrt(n)) / cfg.lr  # alpha = lr
        z = z + g - sigma * w
        denom = (cfg.beta + jnp.sqrt(n_new)) / cfg.lr + cfg.l2
        w = jnp.where(jnp.abs(z) <= cfg.l1, 0.0, -(z - jnp.sign(z) * cfg.l1) / denom)
        return _set(table, ids, w), (_set(z_all, ids, z), _set(n_all, ids, n_new))

    return SparseOptimizer(init, update)


SPARSE_OPTIMIZERS: dict[str, Callable[[SparseOptimConfig], SparseOptimizer]] = {
    "sgd": sgd, "adagrad": adagrad, "rowwise_adagrad": rowwise_adagrad, "adam": adam, "ftrl": ftrl,
}
SPARSE_NAMES = tuple(SPARSE_OPTIMIZERS)  # sparse.name


def with_l2(opt: SparseOptimizer, lam: float) -> SparseOptimizer:
    """`opt` on the loss plus ``lam/2 * sum_{r in R} ||w_r||^2``, R = the rows the step touches.

    The penalty's gradient ``lam * w_r`` is added once to each touched row's summed gradient
    (ids merged exactly by `coalesce` first), then `opt` updates the row as usual: the dense
    L2 gradient restricted to those rows, which is what a sparse (lazy) optimizer can afford.
    Untouched rows are not decayed. Once per *row* (not per occurrence) also makes the result
    independent of how an algorithm splits or merges a step's entries (sync's owner routing,
    GBA's buffer).

    FuxiCTR's ``embedding_regularizer`` adds ``lambda/p * ||W||_p^p`` (p = 2) over each *whole*
    embedding weight (fuxictr/pytorch/models/rank_model.py ``regularization_loss``), which
    decays every row at every step; here the same term is restricted to the rows the step
    looks up (a lazy L2), so its gradient on those rows equals FuxiCTR's and the rest stay
    untouched, as a sparse optimizer requires.

    Args:
      opt: the optimizer of the data loss.
      lam: lambda >= 0; 0 returns `opt` itself (bitwise unchanged updates).
    """
    if lam == 0:
        return opt

    def update(table, slots, ids, grads, step):
        v = table.shape[0]
        ids, g = coalesce(ids, grads, v)
        real = (ids < v)[:, None]  # padding slots (id V) must stay zero: they are dropped anyway
        g = g + jnp.where(real, lam * _rows(table, ids), 0.0).astype(g.dtype)
        return opt.update(table, slots, ids, g, step)

    return SparseOptimizer(opt.init, update)


def make_sparse_optimizer(cfg: SparseOptimConfig) -> SparseOptimizer:
    return with_l2(SPARSE_OPTIMIZERS[cfg.name](cfg), cfg.embedding_l2)
