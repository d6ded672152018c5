"""The weights-rich operators of CTR models, as small pure functions, plus an MLP.

Each operator reduces over the field axis F (or over the flattened field features), which is
what DES (Rong et al., SIGIR 2020, Sec. 4) exploits: with fields sharded across devices, every
device computes the operator's partial result over its own fields and one ``psum`` recombines
it. The docstrings say which partial result that is; ``sharding/des.py`` substitutes these
functions and is tested against them.

Layout of the "flattened" model input used by the deep towers and DCN:
``x0 = concat(emb.reshape(B, F * D), dense)``, field-major, so field ``f`` owns columns
``[f * D, (f + 1) * D)`` of x0 and rows ``[f * D, (f + 1) * D)`` of the first layer's kernel.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def first_order(wide_acts: jax.Array) -> jax.Array:
    """First-order (linear) term of LR/FM: the sum of the per-field weights.

    For one-hot fields ``x_j = 1`` at the looked-up id, so ``sum_j w_j x_j`` is the sum over
    fields of the looked-up dim-1 "embeddings".

    Args:
      wide_acts: f32[B, F, 1] looked-up first-order weights (group ``"wide"``).

    Returns:
      f32[B] the sum over fields. DES: ``psum`` of the sum over the local fields.

    References:
      Rong et al., "Distributed Equivalent Substitution Training for Large-Scale Recommender
      Systems", SIGIR 2020, Sec. 4.1 (LR).
    """
    return jnp.sum(wide_acts, axis=(1, 2))


def fm_second_order(emb: jax.Array) -> jax.Array:
    """FM pairwise term ``sum_{i<j} <v_i, v_j>`` in Rendle's O(F*D) sum-square form.

    ``0.5 * sum_d((sum_f v_fd)^2 - sum_f v_fd^2)`` (Rendle 2010, Lemma 3.1), instead of the
    O(F^2 * D) sum over pairs.

    Args:
      emb: f32[B, F, D] field embeddings (group ``"emb"``).

    Returns:
      f32[B] the second-order interaction. DES: with ``M1 = sum_f v_f`` and
      ``M2 = sum_f v_f^2`` summed over local fields,
      ``0.5 * <psum(M1), psum(M1)> - 0.5 * sum_d psum(M2)``.

    References:
      Rendle, "Factorization Machines", ICDM 2010, Eq. 1 and Lemma 3.1.
      Rong et al., SIGIR 2020, Sec. 4.2 (FM).
    """
    square_of_sum = jnp.square(jnp.sum(emb, axis=1))  # (sum_f v_f)^2, [B, D]
    sum_of_square = jnp.sum(jnp.square(emb), axis=1)  # sum_f v_f^2,   [B, D]
    return 0.5 * jnp.sum(square_of_sum - sum_of_square, axis=-1)


def interaction_pairs(n: int, self_pairs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices ``(i, j)`` of the pairs `dot_interaction` returns, in its order.

    Args:
      n: N, the number of interacting vectors.
      self_pairs: include ``i == j``.

    Returns:
      Two int arrays of length N(N-1)/2 (or N(N+1)/2 with self pairs): the upper triangle of an
      N x N matrix in row-major order, ``(0,1), (0,2), ..., (0,N-1), (1,2), ...``.
    """
    return np.triu_indices(n, k=0 if self_pairs else 1)


def dot_interaction(vectors: jax.Array, self_pairs: bool = False) -> jax.Array:
    """DLRM dot interaction: the dot products of all pairs of vectors.

    ``Z = V V^T`` per example, then the upper triangle of Z in row-major order
    (`interaction_pairs`). The reference DLRM takes the strictly *lower* triangle in row-major
    order, i.e. the same values in a permuted order; a model trained there maps here by
    permuting the rows of the top MLP's first kernel.

    Args:
      vectors: f32[B, N, D] the interacting vectors (DLRM: bottom MLP output then embeddings).
      self_pairs: include the i == j products (squared norms).

    Returns:
      f32[B, N(N-1)/2], or f32[B, N(N+1)/2] with ``self_pairs``.

    References:
      Naumov et al., "Deep Learning Recommendation Model for Personalization and Recommendation
      Systems", arXiv 1906.00091, 2019, Sec. 2.1.3 / 3 ("dot" interaction).
    """
    return _dot_interaction(vectors, self_pairs)


def _pair_tables(n: int, self_pairs: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Constant index tables of the interaction and its backward.

    Returns:
      flat: i32[P] positions of the pairs in the row-major flattened N x N matrix Z.
      sym: i32[N*N] for each (f, g) of Z the pair index holding it (either order); P (a zero
        slot) where no pair does (the diagonal without self pairs).
      scale: f32[N*N] 2 on the diagonal (d<v,v>/dv = 2v), 1 elsewhere.
    """
    i, j = interaction_pairs(n, self_pairs)
    p = len(i)
    sym = np.full((n, n), p, np.int32)
    sym[i, j] = sym[j, i] = np.arange(p)
    scale = np.ones((n, n), np.float32)
    np.fill_diagonal(scale, 2.0)
    return (i * n + j).astype(np.int32), sym.reshape(-1), scale.reshape(-1)


def _materialized_transpose(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """``jnp.transpose(x, axes)`` written out as an array.

    XLA folds a transpose into the dimension numbers of the dot that produces its operand or
    consumes its result; optimization barriers on both sides keep it a real copy, so the dots
    run in the layouts chosen here (see `_dot_interaction` and `dense_dot_general` for where
    and why that is faster on XLA:CPU).
    """
    barrier = jax.lax.optimization_barrier
    return barrier(jnp.transpose(barrier(x), axes))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _dot_interaction(vectors: jax.Array, self_pairs: bool) -> jax.Array:
    return _dot_interaction_fwd(vectors, self_pairs)[0]


def _dot_interaction_fwd(vectors, self_pairs):
    """``Z = V V^T`` as ``V @ (V^T materialized)``: both operands of the batched product in
    row-major [m, k] x [k, n] form. Left to itself XLA:CPU runs ``V V^T`` with the second
    operand contracted along its rows, 1.2-1.4x slower for these 27 x 16 matrices; the
    [B, 16, 27] transpose is also what the backward product reads, so it is the residual.
    """
    b, n, _ = vectors.shape
    flat, _, _ = _pair_tables(n, self_pairs)
    vt = _materialized_transpose(vectors, (0, 2, 1))  # [B, D, N]
    z = jnp.einsum("bnd,bdm->bnm", vectors, vt).reshape(b, n * n)
    return jnp.take(z, flat, axis=1, mode="clip"), vt


def _dot_interaction_bwd(self_pairs, vt, g):
    """dV = S V with S the symmetric [N, N] matrix of pair gradients (one batched matmul).

    out_p = <v_i, v_j> gives dv_i += g_p v_j and dv_j += g_p v_i, so dV_f = sum_g S_fg V_g with
    S_fg = S_gf = g_p (2 g_p on the diagonal). Autodiff of the gather instead emits a zero
    [B, N, N] buffer, a scatter-add and two batched matmuls (PERF_NOTES 4: measured ~1.2x on the
    whole DLRM step, scripts/bench.py).

    The product is taken as ``dV^T = V^T S`` (S is symmetric) from the forward's materialized
    ``V^T``, then transposed back: on XLA:CPU that [16, 27] x [27, 27] form and the transpose
    together take ~0.7x the time of ``S V`` with its 16-wide output (2-core VM, fifth session).
    """
    b, _, n = vt.shape
    _, sym, scale = _pair_tables(n, self_pairs)
    gz = jnp.concatenate([g, jnp.zeros((b, 1), g.dtype)], axis=1)
    s = (jnp.take(gz, sym, axis=1, mode="clip") * scale).reshape(b, n, n)
    return (_materialized_transpose(jnp.einsum("bdg,bgf->bdf", vt, s), (0, 2, 1)),)


_dot_interaction.defvjp(_dot_interaction_fwd, _dot_interaction_bwd)


def cross_layer(x0: jax.Array, x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """One DCN cross layer: ``x_{l+1} = x_0 x_l^T w_l + b_l + x_l``.

    ``x_0 x_l^T w_l`` is computed as ``x_0 * (x_l . w_l)``: a scalar per example times x_0,
    O(K) instead of forming the K x K outer product.

    Args:
      x0: f32[B, K] the input of the cross network, x_0.
      x: f32[B, K] the previous layer's output, x_l.
      w: f32[K] the layer's weight vector, w_l.
      b: f32[K] the layer's bias, b_l.

    Returns:
      f32[B, K] x_{l+1}. DES: ``x_l . w_l`` is a sum over features, so
      ``x0 * psum(x_local . w_local) + b + x``.

    References:
      Wang et al., "Deep & Cross Network for Ad Click Predictions", ADKDD 2017, Eq. 3.
      Rong et al., SIGIR 2020, Sec. 4.4 (DCN).
    """
    return x0 * (x @ w)[:, None] + b + x


def varying_axes(x) -> frozenset:
    """The mesh axes ``x`` (an array, tracer or its abstract value / shape struct) varies over
    inside `jax.shard_map`; empty outside it."""
    aval = jax.typeof(x) if isinstance(x, jax.Array) else x
    return getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())


@jax.custom_vjp
def _matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    return x @ w


def _matmul_fwd(x, w):
    return x @ w, (x, w)


def _matmul_bwd(res, g):
    """``dx = g w^T`` and ``dw = x^T g``, the latter as ``(g^T x)^T`` when the layer at least
    halves its width.

    Both weight-gradient forms contract the batch (row) dimension of both operands, which
    XLA:CPU 0.10 does not route to its fast YNNPACK kernels. Its fallback is faster when the
    output is wide: for a 512-row slice of a 512 -> 256 layer ``(g^T x)^T`` runs at 1.05-1.15x
    ``x^T g`` (transpose included), 256 -> 64 at 1.1-1.5x, 400 -> 1 at 6x; but 0.9x for the
    near-square 429 -> 400 of the deep towers and 0.8x for 367 -> 512. So when out <= in / 2
    ``g^T x`` is formed and transposed; elsewhere ``x^T g``.
    Measured on the whole DLRM step at B=4096: 1.03-1.07x (docs/performance.md). On other
    backends the cost is one transpose of a weight-sized matrix.

    Inside `jax.shard_map`, a weight that does not vary over an axis the activations vary over
    gets its gradient summed over that axis, as autodiff's transpose of the implicit cast
    would do.
    """
    x, w = res
    dx = g @ w.T
    if 2 * w.shape[1] <= w.shape[0]:
        dw = _materialized_transpose(g.T @ x, (1, 0))
    else:
        dw = x.T @ g
    axes = tuple(sorted(varying_axes(dw) - varying_axes(w)))
    return dx, (jax.lax.psum(dw, axes) if axes else dw)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def dense_dot_general(x, kernel, dimension_numbers, precision=None,
                      preferred_element_type=None) -> jax.Array:
    """`jax.lax.dot_general` for `nn.Dense`, with the weight gradient of `_matmul_bwd` for the
    plain [B, in] x [in, out] case (the MLPs of every model); anything else goes to
    `jax.lax.dot_general` unchanged."""
    plain = (x.ndim == 2 and kernel.ndim == 2 and precision is None
             and preferred_element_type is None
             and tuple(map(tuple, dimension_numbers[0])) == ((1,), (0,))
             and not any(dimension_numbers[1]))
    if plain:
        return _matmul(x, kernel)
    return jax.lax.dot_general(x, kernel, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)


class MLP(nn.Module):
    """A stack of Dense layers with ReLU between them, optionally with batch norm and dropout.

    Parameters are named ``layer_0 .. layer_{n-1}``, each ``{"kernel": [in, out], "bias": [out]}``
    (Flax defaults: LeCun-normal kernels, zero biases). An MLP with no layers is the identity.

    A *hidden* layer is one followed by a ReLU (every layer but a linear last one). With
    ``batch_norm`` a hidden layer is ``Dense -> BatchNorm -> ReLU`` (``bn_i``: ``scale``, ``bias``
    params and ``mean``, ``var`` running averages in the ``batch_stats`` collection); with
    ``dropout > 0`` a `nn.Dropout` follows its ReLU: FuxiCTR's ``MLP_Block`` order
    (fuxictr/pytorch/layers/blocks/mlp_block.py: Linear, BatchNorm1d, activation, Dropout).
    Neither touches the output layer. With both off the module is exactly the plain stack
    (same parameters, same arithmetic).

    Attributes:
      features: output width of each layer.
      last_linear: no ReLU after the last layer (an output layer producing logits); False for
        a tower whose output feeds another layer (DLRM bottom, DCN deep tower).
      dropout: rate of the dropout after each hidden layer's ReLU (0 = none).
      batch_norm: batch norm between each hidden layer's Dense and its ReLU.
      bn_momentum: running-average decay of the batch norms.
    """

    features: tuple[int, ...]
    last_linear: bool = True
    dropout: float = 0.0
    batch_norm: bool = False
    bn_momentum: float = 0.9

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        n = len(self.features)
        for i, width in enumerate(self.features):
            x = nn.Dense(width, dot_general=dense_dot_general, name=f"layer_{i}")(x)
            if i < n - 1 or not self.last_linear:
                if self.batch_norm:
                    # eps 1e-5 as PyTorch's BatchNorm1d (FuxiCTR); Flax's default is 1e-6.
                    x = nn.BatchNorm(use_running_average=not train, momentum=self.bn_momentum,
                                     epsilon=1e-5, name=f"bn_{i}")(x)
                x = nn.relu(x)
                if self.dropout > 0:
                    x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return x


def mlp_options(cfg) -> dict:
    """The `MLP` keyword arguments a `ModelConfig` sets (dropout, batch norm)."""
    return dict(dropout=cfg.dropout, batch_norm=cfg.batch_norm, bn_momentum=cfg.bn_momentum)


def flatten_inputs(emb: jax.Array, dense: jax.Array) -> jax.Array:
    """``x0 = concat(emb.reshape(B, F * D), dense)``: the field-major input of deep towers.

    Args:
      emb: f32[B, F, D] field embeddings.
      dense: f32[B, n_dense] dense features (n_dense may be 0).

    Returns:
      f32[B, F * D + n_dense].
    """
    return jnp.concatenate([emb.reshape(emb.shape[0], -1), dense.astype(emb.dtype)], axis=1)


def check_inputs(model: str, acts: dict, dense: jax.Array, groups: dict[str, int],
                 n_fields: int, n_dense: int) -> None:
    """Raise a readable error when the activations or dense features have the wrong shape.

    Runs at trace time (shapes are static), so a mismatch is reported before XLA sees it.

    Args:
      model: model name for the message.
      acts: the activation groups passed to the model.
      dense: the dense features passed to the model.
      groups: group name -> embedding dim the model consumes.
      n_fields: F the model was built for.
      n_dense: number of dense features the model was built for.
    """
    if dense.ndim != 2 or dense.shape[1] != n_dense:
        raise ValueError(
            f"{model}: dense features have shape {tuple(dense.shape)}, expected (B, {n_dense}); "
            "build the model from the same FeatureSpec as the data")
    batch = dense.shape[0]
    for group, dim in groups.items():
        if group not in acts:
            raise ValueError(
                f"{model}: needs activation group {group!r} (got {sorted(acts)}); look up the "
                "groups that recjax.models.embedding_groups(cfg) lists")
        shape = tuple(acts[group].shape)
        if shape != (batch, n_fields, dim):
            raise ValueError(
                f"{model}: activation group {group!r} has shape {shape}, expected "
                f"({batch}, {n_fields}, {dim}) = (B, n_fields, dim); check embed_dim and the "
                "FeatureSpec the tables were built from")
