"""DIN: Deep Interest Network (Zhou et al., KDD 2018), target attention over a behaviour sequence.

Inputs (recjax/models/sequence.py): the behaviour sequence arrives as L position fields of
``acts["emb"]`` (``e_1 .. e_L``, f32[B, D] each), the candidate ad as its target field ``v_A``
(the one other field of the sequence's table). Positions past an example's length are the zero
vector (mask 0 in the lookup).

User interest, Eq. 3 (Sec. 4.3)::

    v_U(A) = f(v_A, e_1, ..., e_L) = sum_j a(e_j, v_A) e_j = sum_j w_j e_j

with the *local activation unit* a (Fig. 2, right): an MLP over
``[e_j, v_A, e_j - v_A, e_j * v_A]`` (hidden widths ``model.att_mlp``, PReLU after each, then a
1-unit linear layer). As the paper says (Sec. 4.3), the weights are *not* normalised by a softmax,
so the intensity of the interest is kept; hence a zero (padding) behaviour adds exactly nothing,
``w_j * 0 = 0``, to v_U, to the gradient of the unit's weights and to the gradient of v_A, and the
model needs no mask. (A softmax variant would need one.)

Where the text is ambiguous, what is done here:

* Fig. 2 feeds the unit the "out product" of e_j and v_A; the authors' code
  (zhougr1993/DeepInterestNetwork, ``din/model.py``) and DeepCTR / FuxiCTR feed
  ``[q, k, q - k, q * k]``: that elementwise form is used here.
* The authors' code applies a masked softmax to the weights although Sec. 4.3 abandons it; the
  paper's form (no softmax) is used.
* Activation: PReLU (Eq. 8's baseline, slope per unit, initialised to 0.25 as in He et al. 2015
  and PyTorch) in the activation unit, ReLU in the tower (`ops.MLP`). Dice (Eq. 9) is not built:
  it needs batch statistics, a training-mode forward that only ``--algo single`` and ``sync``
  run (recjax/registry.py ``train_mode``).
* The behaviours and the target concatenate a sequence's groups: with several sequences (item
  ids, category ids, each a sequence sharing its target's table) ``e_j`` and ``v_A`` are the
  concatenation over the sequences at position j, as the paper concatenates goods, shop and
  category ids (Sec. 4.1). All sequences must have the same L.

The tower (Fig. 2): ``concat[every other field's embedding (the target among them), v_U, dense]
-> MLP(deep_mlp, ReLU) -> 1 logit`` (the paper's 2-way softmax output is a sigmoid of one logit).
``model.din_pooling = sum`` replaces the weights by 1 (``v_U = sum_j e_j``: the paper's
BaseModel, Sec. 4.2, sum pooling), the baseline of docs/models.md.

Parameters: ``att`` {``layer_i``: ``kernel`` [in, out], ``bias`` [out]; ``prelu_i`` [out]} where
layer 0's kernel has 4 blocks of S*D rows (for e_j, v_A, e_j - v_A, e_j * v_A, in that order);
``deep``: `MLP`; ``out``: Dense(1). The first layer is computed as
``e_j (K1 + K3) + v_A (K2 - K3) + (e_j * v_A) K4``, the same sum as the concatenation's product,
so v_A's part is formed once per example rather than once per behaviour.

References:
  Zhou et al., "Deep Interest Network for Click-Through Rate Prediction", KDD 2018, Sec. 4.2-4.3,
  Eq. 3, Fig. 2; Sec. 4.5, Eq. 8-9 (PReLU, Dice).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from recjax.features import FeatureSpec
from recjax.models.config import ModelConfig
from recjax.models.ops import MLP, check_inputs, mlp_options
from recjax.models.sequence import required_sequences

PRELU_INIT = 0.25  # He et al. 2015; torch.nn.PReLU's default


def prelu(x: jax.Array, alpha: jax.Array) -> jax.Array:
    """``x`` where positive, ``alpha * x`` elsewhere (Eq. 8; derivative alpha at 0)."""
    return jnp.where(x > 0, x, alpha * x)


class ActivationUnit(nn.Module):
    """The local activation unit a(e_j, v_A) of Fig. 2: weights f32[B, L] (no softmax)."""

    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, e: jax.Array, q: jax.Array) -> jax.Array:
        """e: f32[B, L, K] behaviours; q: f32[B, K] the target. K = S * D."""
        k = e.shape[-1]
        widths = (*self.hidden, 1)
        h = None
        for i, width in enumerate(widths):
            dense_in = 4 * k if i == 0 else widths[i - 1]
            kernel = self.param(f"layer_{i}", lambda key, s: {
                "kernel": nn.initializers.lecun_normal()(key, s),
                "bias": jnp.zeros(s[1:], jnp.float32)}, (dense_in, width))
            w, b = kernel["kernel"], kernel["bias"]
            if i == 0:  # [e, q, e - q, e * q] @ W, written blockwise (module docstring)
                w1, w2, w3, w4 = w[:k], w[k:2 * k], w[2 * k:3 * k], w[3 * k:]
                h = e @ (w1 + w3) + (q @ (w2 - w3))[:, None, :] + (e * q[:, None, :]) @ w4 + b
            else:
                h = h @ w + b
            if i < len(widths) - 1:
                h = prelu(h, self.param(f"prelu_{i}", nn.initializers.constant(PRELU_INIT),
                                        (width,)))
        return h[..., 0]


class DIN(nn.Module):
    """See the module docstring."""

    n_fields: int  # F
    n_dense: int
    embed_dim: int  # D
    positions: tuple[tuple[int, ...], ...]  # per sequence, its position fields (L each)
    targets: tuple[int, ...]  # per sequence, the field it attends to
    att_mlp: tuple[int, ...]  # hidden widths of the activation unit
    deep_mlp: tuple[int, ...]  # hidden widths of the tower
    pooling: str = "attention"  # attention (Eq. 3) | sum (the BaseModel)
    dropout: float = 0.0
    batch_norm: bool = False
    bn_momentum: float = 0.9
    GROUPS: ClassVar[tuple[str, ...]] = ("emb",)

    @classmethod
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> DIN:
        seqs = required_sequences(spec, "din")
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense, embed_dim=cfg.embed_dim,
                   positions=tuple(s.positions for s in seqs),
                   targets=tuple(s.target for s in seqs), att_mlp=cfg.att_mlp,
                   deep_mlp=cfg.deep_mlp, pooling=cfg.din_pooling, **mlp_options(cfg))

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array,
                 train: bool = False) -> jax.Array:
        check_inputs("din", acts, dense, {"emb": self.embed_dim}, self.n_fields, self.n_dense)
        emb = acts["emb"]
        b = emb.shape[0]
        # e_j = concat over sequences of position j: [B, L, S * D]; v_A likewise [B, S * D]
        e = jnp.concatenate([emb[:, np.array(p), :] for p in self.positions], axis=-1)
        q = emb[:, np.array(self.targets), :].reshape(b, -1)
        if self.pooling == "attention":
            w = ActivationUnit(self.att_mlp, name="att")(e, q)  # w_j = a(e_j, v_A)   [B, L]
            v_u = jnp.einsum("bl,blk->bk", w, e)  # Eq. 3
        else:
            v_u = e.sum(axis=1)
        seq_fields = {f for p in self.positions for f in p}
        other = np.array([f for f in range(self.n_fields) if f not in seq_fields])
        x = jnp.concatenate([emb[:, other, :].reshape(b, -1), v_u, dense.astype(emb.dtype)], 1)
        if self.deep_mlp:
            x = MLP(self.deep_mlp, last_linear=False, name="deep", dropout=self.dropout,
                    batch_norm=self.batch_norm, bn_momentum=self.bn_momentum)(x, train)
        return nn.Dense(1, name="out")(x)[:, 0]
