"""DLRM (Naumov et al. 2019)."""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from recjax.features import FeatureSpec
from recjax.models.config import ModelConfig
from recjax.models.ops import MLP, check_inputs, dot_interaction, mlp_options


class DLRM(nn.Module):
    """Bottom MLP over dense features, dot interaction with the embeddings, top MLP.

    ``x = bottom(dense)`` (ReLU after every layer, the last included, as in the reference
    implementation), ``z = dot_interaction([x, e_1, ..., e_F])`` with x first, and
    ``logit = top(concat(x, z))`` whose last layer is linear. With the Kaggle defaults:
    13-512-256-64-16 bottom, 27 vectors -> 351 pairs, 367-512-256-1 top.

    Without dense features (Avazu, Frappe, MovieLens) there is no bottom MLP: the interaction
    runs over the F embeddings only and the top MLP's input is ``z`` alone.

    Parameters: ``bottom``: `MLP` of widths ``bottom_mlp + (embed_dim,)`` (absent when
    n_dense == 0); ``top``: `MLP` of widths ``top_mlp + (1,)``, ``top.layer_0.kernel`` of shape
    ``[D + P, top_mlp[0]]`` (``[P, ...]`` without dense), rows ordered x then the pairs of
    `ops.interaction_pairs`.

    References:
      Naumov et al., "Deep Learning Recommendation Model for Personalization and Recommendation
      Systems", arXiv 1906.00091, 2019, Sec. 3 and Fig. 1; facebookresearch/dlrm
      ``interact_features`` (arch-interaction-op=dot, interaction-itself=False).
    """

    n_fields: int  # F
    n_dense: int  # number of dense features (may be 0: no bottom MLP)
    embed_dim: int  # D
    bottom_mlp: tuple[int, ...]  # hidden widths; the bottom is bottom_mlp + (embed_dim,)
    top_mlp: tuple[int, ...]  # hidden widths; the top is top_mlp + (1,)
    interaction_self: bool = False  # include the i == j pairs
    dropout: float = 0.0  # dropout after every hidden MLP layer (model.dropout)
    batch_norm: bool = False  # batch norm in every hidden MLP layer (model.batch_norm)
    bn_momentum: float = 0.9  # running-average decay of the batch norms
    GROUPS: ClassVar[tuple[str, ...]] = ("emb",)

    @classmethod
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> DLRM:
        n_vectors = spec.n_fields + (spec.n_dense > 0)
        if n_vectors < 2 and not cfg.interaction_self:
            raise ValueError(
                f"dlrm: {n_vectors} interacting vector(s) give no pairs; use a dataset with more "
                "fields or set model.interaction_self=true")
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense, embed_dim=cfg.embed_dim,
                   bottom_mlp=cfg.bottom_mlp, top_mlp=cfg.top_mlp,
                   interaction_self=cfg.interaction_self, **mlp_options(cfg))

    @property
    def _mlp(self) -> dict:
        return dict(dropout=self.dropout, batch_norm=self.batch_norm, bn_momentum=self.bn_momentum)

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array,
                 train: bool = False) -> jax.Array:
        check_inputs("dlrm", acts, dense, {"emb": self.embed_dim}, self.n_fields, self.n_dense)
        emb = acts["emb"]
        if self.n_dense > 0:
            x = MLP((*self.bottom_mlp, self.embed_dim), last_linear=False, name="bottom",
                    **self._mlp)(dense, train)
            z = dot_interaction(jnp.concatenate([x[:, None, :], emb], axis=1),
                                self.interaction_self)
            top_in = jnp.concatenate([x, z], axis=1)
        else:
            top_in = dot_interaction(emb, self.interaction_self)
        return MLP((*self.top_mlp, 1), name="top", **self._mlp)(top_in, train)[:, 0]
