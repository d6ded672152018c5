"""BST: Behavior Sequence Transformer (Chen et al., DLP-KDD 2019), self-attention over the
behaviour sequence and the target item.

Inputs as DIN's (recjax/models/sequence.py): the sequence arrives as L position fields of
``acts["emb"]`` sharing the table of its target field; positions past an example's length are
the zero vector. With several sequences (item ids, category ids) a behaviour concatenates them,
as the paper concatenates an item's ``item_id`` and ``category_id`` embeddings (Sec. 2.1).

Tokens (Sec. 2.1, Fig. 1): ``v_t`` the target item and ``v_1 .. v_L`` the behaviours, each its
item features concatenated with a *position* embedding (concatenated, not added as in Vaswani et
al.). The paper's position is ``pos(v_i) = t(v_t) - t(v_i)``, the time since the click; recjax
has no timestamps, so the position is the index in the sequence: 0 for the target (whose time
difference is 0), j + 1 for behaviour j (learned, ``pos`` [L + 1, P] with
P = ``model.bst_pos_dim``). A token is d = S * D + P wide.

One transformer block (Sec. 2.2), ``model.bst_blocks`` of them stacked (Eq. 6)::

    head_i = softmax(E W_i^Q (E W_i^K)^T / sqrt(d_h)) E W_i^V                        (Eq. 1, 3)
    S      = MH(E) = concat(head_1, ..., head_h) W^H                                  (Eq. 2)
    S'     = LayerNorm(E + Dropout(S))                                                 (Eq. 4)
    F      = LayerNorm(S' + Dropout(LeakyReLU(S' W^(1) + b^(1)) W^(2) + b^(2)))        (Eq. 5)

with h = ``model.bst_heads`` heads of width d_h = d / h (W_i^Q is d x d_h; ``wq`` holds the h of
them side by side, [d, d]), W^(1) d x ``bst_ffn`` (0: 4 d), LeakyReLU's slope 0.01. Then
(Sec. 2.3) ``concat[the other fields, the L + 1 tokens of F flattened, dense] -> MLP(deep_mlp)
-> 1 logit``.

Where the text leaves a choice, what is done here:

* Eq. 4 reads ``LayerNorm(S + Dropout(MH(S)))``; with S = MH(E) of Eq. 2 that would apply the
  attention twice. The residual is the block's input, as in Vaswani et al. and every public BST
  (DeepCTR, FuxiCTR): ``LayerNorm(E + Dropout(MH(E)))``.
* ``sqrt(d)`` of Eq. 1 is taken per head, sqrt(d_h) (Vaswani et al.).
* No biases in W^Q, W^K, W^V, W^H (Eq. 2-3 write none); b^(1), b^(2) as Eq. 5.
* *Padding.* The paper's sequences have no padding. Here a padded behaviour (every one of its
  looked-up rows exactly zero: the lookup gives exact zeros at masked positions) is no key of the
  softmax and its output token is zeroed before the tower, so the ids at masked positions change
  nothing (tests/test_models_bst.py). A real behaviour whose rows are all exactly 0.0 would be
  taken for padding: rows drawn from a continuous init never are, but ``--embed.init 0`` (zero
  tables) would hide every behaviour from the attention, and from its gradient, for good.
* The tower reads the other fields (every field but the sequences and their targets, which are
  token 0) and every token's output, the target's among them (Fig. 1 concatenates all of the
  transformer's outputs); ReLU there (`ops.MLP`, as DIN's tower), LeakyReLU where Eq. 5 says.
* Table 1's settings (8 heads, 1 block, dropout 0.2, MLP 1024-512-256) are options:
  ``model.bst_heads``, ``model.bst_blocks``, ``model.dropout`` (here the tower's and Eq. 4-5's),
  ``model.deep_mlp``.

Parameters: ``pos`` [L + 1, P]; ``block_b`` {``wq``, ``wk``, ``wv``, ``wo`` [d, d], ``ln1``,
``ln2`` {``scale``, ``bias``} [d], ``ffn_0`` {``kernel`` [d, f], ``bias``}, ``ffn_1``
{``kernel`` [f, d], ``bias``}}; ``deep``: `MLP`; ``out``: Dense(1).

References:
  Chen, Zhao, Li, Huang, Ou, "Behavior Sequence Transformer for E-commerce Recommendation in
  Alibaba", DLP-KDD 2019 (arXiv 1905.06874), Sec. 2.1-2.3, Eq. 1-6, Fig. 1, Table 1.
  Vaswani et al., "Attention Is All You Need", NeurIPS 2017, Sec. 3.2.
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

LN_EPS = 1e-5  # PyTorch's LayerNorm default (Flax's is 1e-6)
LEAKY_SLOPE = 0.01  # LeakyReLU's negative slope (the paper gives none; PyTorch's and JAX's default)
POS_INIT_STD = 0.05  # std of the position embeddings at init


class Block(nn.Module):
    """One transformer block, Eq. 1-5, over tokens f32[B, T, d] whose keys are ``valid``."""

    heads: int
    ffn: int
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, valid: jax.Array, train: bool = False) -> jax.Array:
        b, t, d = x.shape
        dh = d // self.heads
        init = nn.initializers.lecun_normal()
        w = {n: self.param(n, init, (d, d)) for n in ("wq", "wk", "wv", "wo")}
        q, k, v = ((x @ w[n]).reshape(b, t, self.heads, dh) for n in ("wq", "wk", "wv"))
        s = jnp.einsum("bqhc,bkhc->bhqk", q, k) / np.sqrt(dh)  # Eq. 1 per head (Eq. 3)
        s = jnp.where(valid[:, None, None, :], s, -jnp.inf)  # padding is no key
        att = jnp.einsum("bhqk,bkhc->bqhc", jax.nn.softmax(s, axis=-1), v)
        mh = att.reshape(b, t, d) @ w["wo"]  # Eq. 2: concat(heads) W^H
        drop = nn.Dropout(self.dropout, deterministic=not train)
        x = nn.LayerNorm(LN_EPS, name="ln1")(x + drop(mh))  # Eq. 4
        h = jax.nn.leaky_relu(nn.Dense(self.ffn, name="ffn_0")(x), LEAKY_SLOPE)
        return nn.LayerNorm(LN_EPS, name="ln2")(x + drop(nn.Dense(d, name="ffn_1")(h)))  # Eq. 5


class BST(nn.Module):
    """See the module docstring."""

    n_fields: int  # F
    n_dense: int
    embed_dim: int  # D
    positions: tuple[tuple[int, ...], ...]  # per sequence, its position fields (L each)
    targets: tuple[int, ...]  # per sequence, the field it attends to
    heads: int  # h
    blocks: int  # b, transformer blocks stacked
    ffn: int  # width of W^(1) (0: 4 d)
    pos_dim: int  # P, width of the position embedding
    deep_mlp: tuple[int, ...]  # hidden widths of the tower
    dropout: float = 0.0
    batch_norm: bool = False
    bn_momentum: float = 0.9
    GROUPS: ClassVar[tuple[str, ...]] = ("emb",)

    @classmethod
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> BST:
        seqs = required_sequences(spec, "bst")
        d = len(seqs) * cfg.embed_dim + cfg.bst_pos_dim
        if d % cfg.bst_heads:
            raise ValueError(
                f"bst: a token is {len(seqs)} sequence(s) x model.embed_dim {cfg.embed_dim} + "
                f"model.bst_pos_dim {cfg.bst_pos_dim} = {d} wide, which model.bst_heads="
                f"{cfg.bst_heads} heads do not divide; change one of them")
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense, embed_dim=cfg.embed_dim,
                   positions=tuple(s.positions for s in seqs),
                   targets=tuple(s.target for s in seqs), heads=cfg.bst_heads,
                   blocks=cfg.bst_blocks, ffn=cfg.bst_ffn or 4 * d, pos_dim=cfg.bst_pos_dim,
                   deep_mlp=cfg.deep_mlp, **mlp_options(cfg))

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array,
                 train: bool = False) -> jax.Array:
        check_inputs("bst", acts, dense, {"emb": self.embed_dim}, self.n_fields, self.n_dense)
        emb = acts["emb"]
        b = emb.shape[0]
        # item features of the tokens: the target (token 0), then behaviours 1..L   [B, T, S * D]
        e = jnp.concatenate([emb[:, np.array(p), :] for p in self.positions], axis=-1)
        q = emb[:, np.array(self.targets), :].reshape(b, 1, -1)
        items = jnp.concatenate([q, e], axis=1)
        t = items.shape[1]
        valid = jnp.concatenate([jnp.ones((b, 1), bool), jnp.any(e != 0, axis=-1)], axis=1)
        x = items
        if self.pos_dim:
            pos = self.param("pos", nn.initializers.normal(POS_INIT_STD), (t, self.pos_dim))
            x = jnp.concatenate([items, jnp.broadcast_to(pos, (b, t, self.pos_dim))], axis=-1)
        for i in range(self.blocks):  # Eq. 6: blocks stacked
            x = Block(self.heads, self.ffn, self.dropout, name=f"block_{i}")(x, valid, train)
        x = x * valid[..., None]  # a padded behaviour's token reaches nothing
        used = {f for p in self.positions for f in p} | set(self.targets)
        other = np.array([f for f in range(self.n_fields) if f not in used], np.int64)
        h = jnp.concatenate([emb[:, other, :].reshape(b, -1), x.reshape(b, -1),
                             dense.astype(emb.dtype)], axis=1)
        if self.deep_mlp:
            h = MLP(self.deep_mlp, last_linear=False, name="deep", dropout=self.dropout,
                    batch_norm=self.batch_norm, bn_momentum=self.bn_momentum)(h, train)
        return nn.Dense(1, name="out")(h)[:, 0]
