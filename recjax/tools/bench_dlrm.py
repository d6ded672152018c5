"""The in-run reference for scripts/bench.py: a minimal plain-JAX DLRM training step.

This is the "plain JAX" peer of ../shared/PERF_NOTES.md: gather rows per table, `value_and_grad`
w.r.t. (dense params, gathered rows), SGD on both, donated ``table.at[ids].add``. No recjax code,
so the ratio recjax / reference measures what recjax's abstractions and optimizations cost or win.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def init(cards, n_dense: int, dim: int, bottom, top, seed: int = 0):
    """(params, tables): MLP weights (Glorot-normal) and U(+-1/sqrt(V)) tables."""
    rng = np.random.default_rng(seed)
    n_vec = len(cards) + 1
    sizes_bot = [n_dense, *bottom, dim]
    sizes_top = [dim + n_vec * (n_vec - 1) // 2, *top, 1]

    def mlp(sizes):
        return [(jnp.asarray(rng.normal(0, np.sqrt(2 / (a + b)), (a, b)), jnp.float32),
                 jnp.zeros((b,), jnp.float32)) for a, b in zip(sizes[:-1], sizes[1:])]

    tables = [jnp.asarray(rng.uniform(-1, 1, (c, dim)) / np.sqrt(c), jnp.float32) for c in cards]
    return {"bot": mlp(sizes_bot), "top": mlp(sizes_top)}, tables


def _mlp(layers, h, last_linear):
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if not (last_linear and i == len(layers) - 1):
            h = jax.nn.relu(h)
    return h


def _loss(params, emb, dense, label):
    bo = _mlp(params["bot"], dense, last_linear=False)
    t = jnp.concatenate([bo[:, None, :], emb], axis=1)
    i, j = np.triu_indices(t.shape[1], k=1)
    z = jnp.einsum("bfd,bgd->bfg", t, t)[:, i, j]
    logit = _mlp(params["top"], jnp.concatenate([bo, z], axis=1), last_linear=True)[:, 0]
    return jnp.mean(jax.nn.softplus(logit) - label * logit)


def make_step(lr: float):
    """The jitted, donated step ``(params, tables, dense, ids[B, F], label) -> (params, tables, loss)``."""

    def step(params, tables, dense, ids, label):
        emb = jnp.stack([t[ids[:, f]] for f, t in enumerate(tables)], axis=1)
        loss, (gp, ge) = jax.value_and_grad(_loss, argnums=(0, 1))(params, emb, dense, label)
        params = jax.tree.map(lambda p, g: p - lr * g, params, gp)
        tables = [t.at[ids[:, f]].add(-lr * ge[:, f]) for f, t in enumerate(tables)]
        return params, tables, loss

    return jax.jit(step, donate_argnums=(0, 1))


def flops_per_example(n_dense: int, n_fields: int, dim: int, bottom, top) -> float:
    """Training FLOPs per example: 3 x forward (fwd + 2 backward GEMMs), MLPs + interaction."""
    n_vec = n_fields + 1
    bot = [n_dense, *bottom, dim]
    tp = [dim + n_vec * (n_vec - 1) // 2, *top, 1]
    macs = sum(a * b for a, b in zip(bot[:-1], bot[1:])) + sum(a * b for a, b in zip(tp[:-1], tp[1:]))
    macs += n_vec * n_vec * dim  # batched T T^T
    return 3 * 2 * macs


def make_gemm_ceiling(n_dense: int, n_fields: int, dim: int, bottom, top, batch: int,
                      rows: int, matmul=jnp.matmul):
    """``run(n)``: only the MLPs' matrix products, forward and backward (with the ReLUs), of
    ``batch`` examples in ``rows``-row slices: no embeddings, interaction, loss or optimizer.
    What a DLRM step costs if everything but its GEMMs were free; its rate is the ceiling
    that GEMM throughput puts on any implementation on this machine that computes the products
    as ``matmul`` and its autodiff do (scripts/bench.py passes recjax's)."""
    n_vec = n_fields + 1
    sizes = [[n_dense, *bottom, dim], [dim + n_vec * (n_vec - 1) // 2, *top, 1]]
    shapes = [(a, b) for s in sizes for a, b in zip(s[:-1], s[1:])]
    ws = [jnp.full(s, 0.01, jnp.float32) for s in shapes]
    xs = [jnp.ones((rows, a), jnp.float32) for a, _ in shapes]

    def products(ws, xs):
        return sum(jnp.sum(jax.nn.relu(matmul(x, w))) for w, x in zip(ws, xs))

    grad = jax.jit(jax.grad(products, argnums=(0, 1)))
    slices = max(batch // rows, 1)

    def run(n):
        out = None
        for _ in range(n * slices):
            out = grad(ws, xs)
        jax.block_until_ready(out)

    return run, lambda: None


def make_peak_gemm(batch: int, flops_per_ex: float, k: int = 2048):
    """``run(n)``: n large fp32 matrix products, each with the FLOPs of one training step of
    ``batch`` examples ([m, k] @ [k, k], m = batch x flops_per_ex / 2k^2). Its examples/sec is
    the roofline measured on this machine: what a step running at the peak GEMM rate would do."""
    m = max(round(batch * flops_per_ex / (2 * k * k)), 1)
    a = jnp.full((m, k), 0.5, jnp.float32)
    w = jnp.full((k, k), 1.0 / k, jnp.float32)
    mm = jax.jit(lambda a, w: a @ w)

    def run(n):
        out = None
        for _ in range(n):
            out = mm(a, w)
        jax.block_until_ready(out)

    return run, lambda: None
