"""DCN-v2 (Wang et al. 2021): the matrix cross layer, its low-rank and mixture-of-experts forms,
stacked or parallel with a deep tower.

Cross layers over ``x0 = concat(flatten(emb), dense)`` (K = F * D + n_dense), for l < L:

* full rank (``model.cross_rank = 0``), Eq. 1:   ``x_{l+1} = x0 * (W_l x_l + b_l) + x_l``
  with ``W_l`` f32[K, K];
* low rank (``cross_rank = r``, one expert), Sec. 5.1 (the paper's "W = U V^T"):
  ``x_{l+1} = x0 * (U_l (V_l^T x_l) + b_l) + x_l`` with ``U_l, V_l`` f32[K, r];
* mixture of low-rank experts (``cross_experts = E > 1``), Sec. 5.1 "Mixture of low-rank
  DCN", Eq. 4-5: ``x_{l+1} = sum_i G_i(x_l) E_i(x_l) + x_l`` with experts
  ``E_i(x_l) = x0 * (U_{l,i} g(C_{l,i} g(V_{l,i}^T x_l)) + b_l)`` (``C`` f32[r, r], g = ReLU,
  the bias shared by a layer's experts) and gates ``G(x_l) = softmax_i(x_l . w_{l,i})``.

Structure (Sec. 3, Fig. 2): ``stacked`` feeds the cross network's output through the deep tower
(``logit = w . MLP(x_L) + b``); ``parallel`` runs both on x0 and concatenates (``logit =
w . [x_L, MLP(x0)] + b``), DCN-v1's layout. With an empty ``deep_mlp`` either is the cross
network alone.

Forms as TorchRec writes them (``torchrec.modules.crossnet``: ``CrossNet`` is Eq. 1's full-rank
layer, ``VectorCrossNet`` DCN-v1's, ``LowRankCrossNet`` the low-rank form without g,
``LowRankMixtureCrossNet`` the mixture, whose gate is a bias-free linear layer per expert and
whose g is ReLU); tests/test_peer_models.py checks each against TorchRec. Two deviations, said
here: the paper's Eq. 4 leaves open whether a single low-rank expert applies C and g, TorchRec's
mixture does, its ``LowRankCrossNet`` does not; here one expert is the ``LowRankCrossNet`` form
and C, g come with E > 1 only. TorchRec's (and DeepCTR's ``CrossNetMix``) gates are one set
shared by all layers; here each layer has its own, as each has its own experts (Eq. 5's
``G_i(x_l)`` is read per layer).

Parameters (per layer l, stacked on a leading L axis): ``cross_w`` f32[L, K, K] (full rank), or
``cross_u``, ``cross_v`` f32[L, E, K, r], ``cross_c`` f32[L, E, r, r] and ``cross_gate``
f32[L, E, K] (E > 1); ``cross_b`` f32[L, K]. Initialisation (not in the paper): Glorot normal
for the matrices (TorchRec's xavier_normal), zeros for the biases.

References:
  Wang et al., "DCN V2: Improved Deep & Cross Network and Practical Lessons for Web-scale
  Learning to Rank Systems", WWW 2021, Eq. 1, 4-5, Sec. 3 and 5.1.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from recjax.features import FeatureSpec
from recjax.models.config import ModelConfig
from recjax.models.ops import MLP, check_inputs, flatten_inputs, mlp_options


def cross_full(x0: jax.Array, x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """Eq. 1: ``x0 * (x W^T + b) + x`` for a batch; w f32[K, K] acts as ``W_l x_l``."""
    return x0 * (x @ w.T + b) + x


def cross_low_rank(x0: jax.Array, x: jax.Array, u: jax.Array, v: jax.Array,
                   b: jax.Array) -> jax.Array:
    """``x0 * (U (V^T x) + b) + x``; u, v f32[K, r]."""
    return x0 * ((x @ v) @ u.T + b) + x


def cross_mixture(x0: jax.Array, x: jax.Array, u: jax.Array, v: jax.Array, c: jax.Array,
                  gate: jax.Array, b: jax.Array) -> jax.Array:
    """Eq. 4-5: ``sum_i softmax_i(x . gate_i) * x0 * (U_i relu(C_i relu(V_i^T x)) + b) + x``.

    Args:
      u, v: f32[E, K, r]; c: f32[E, r, r] (applied as ``C_i h``); gate: f32[E, K]; b: f32[K].
    """
    h = jax.nn.relu(jnp.einsum("bk,ekr->ber", x, v))  # g(V_i^T x)   [B, E, r]
    h = jax.nn.relu(jnp.einsum("ber,esr->bes", h, c))  # g(C_i h)    [B, E, r]
    experts = x0[:, None, :] * (jnp.einsum("ber,ekr->bek", h, u) + b)  # [B, E, K]
    g = jax.nn.softmax(x @ gate.T, axis=-1)  # G(x_l)   [B, E]
    return jnp.einsum("be,bek->bk", g, experts) + x


def _glorot(batch_dims: int):
    """Glorot (Xavier) normal over the last two axes, the leading `batch_dims` axes (layers,
    experts) being separate matrices: std = sqrt(2 / (fan_in + fan_out)) of one matrix."""
    return nn.initializers.variance_scaling(1.0, "fan_avg", "normal", in_axis=-1, out_axis=-2,
                                            batch_axis=tuple(range(batch_dims)))


class DCNv2(nn.Module):
    """See the module docstring."""

    n_fields: int  # F
    n_dense: int
    embed_dim: int  # D
    deep_mlp: tuple[int, ...]
    cross_layers: int  # L
    cross_rank: int  # 0 = full-rank W; r > 0 = low rank
    cross_experts: int  # E
    structure: str  # stacked | parallel
    dropout: float = 0.0
    batch_norm: bool = False
    bn_momentum: float = 0.9
    GROUPS: ClassVar[tuple[str, ...]] = ("emb",)

    @classmethod
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> DCNv2:
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense, embed_dim=cfg.embed_dim,
                   deep_mlp=cfg.deep_mlp, cross_layers=cfg.cross_layers,
                   cross_rank=cfg.cross_rank, cross_experts=cfg.cross_experts,
                   structure=cfg.cross_structure, **mlp_options(cfg))

    def cross(self, x0: jax.Array) -> jax.Array:
        """The cross network: x_L from x0 f32[B, K]."""
        k, n, e, r = x0.shape[1], self.cross_layers, self.cross_experts, self.cross_rank
        b = self.param("cross_b", nn.initializers.zeros, (n, k))
        x = x0
        if r == 0:
            w = self.param("cross_w", _glorot(1), (n, k, k))
            for layer in range(n):
                x = cross_full(x0, x, w[layer], b[layer])
            return x
        u = self.param("cross_u", _glorot(2), (n, e, k, r))
        v = self.param("cross_v", _glorot(2), (n, e, k, r))
        if e == 1:
            for layer in range(n):
                x = cross_low_rank(x0, x, u[layer, 0], v[layer, 0], b[layer])
            return x
        c = self.param("cross_c", _glorot(2), (n, e, r, r))
        gate = self.param("cross_gate", _glorot(1), (n, e, k))
        for layer in range(n):
            x = cross_mixture(x0, x, u[layer], v[layer], c[layer], gate[layer], b[layer])
        return x

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array,
                 train: bool = False) -> jax.Array:
        check_inputs("dcn_v2", acts, dense, {"emb": self.embed_dim}, self.n_fields, self.n_dense)
        x0 = flatten_inputs(acts["emb"], dense)
        x = self.cross(x0)
        mlp = dict(dropout=self.dropout, batch_norm=self.batch_norm, bn_momentum=self.bn_momentum)
        if self.deep_mlp:
            deep = MLP(self.deep_mlp, last_linear=False, name="deep", **mlp)
            x = deep(x, train) if self.structure == "stacked" else jnp.concatenate(
                [x, deep(x0, train)], 1)
        return nn.Dense(1, name="out")(x)[:, 0]
