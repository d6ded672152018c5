"""Factorization machine (Rendle 2010)."""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax

from recjax.features import FeatureSpec
from recjax.models.config import ModelConfig
from recjax.models.lr import dense_linear
from recjax.models.ops import check_inputs, first_order, fm_second_order


class FM(nn.Module):
    """Degree-2 FM: ``logit = w_0 + sum_f w_f + dense @ w_d + sum_{i<j} <v_i, v_j>``.

    Dense features enter the linear term only; the pairwise term runs over the categorical
    fields' embeddings ``v_f`` (group ``"emb"``).

    Parameters: ``bias`` f32[] (w_0), ``dense_w`` f32[n_dense] (absent when n_dense == 0).

    References:
      Rendle, "Factorization Machines", ICDM 2010, Eq. 1.
    """

    n_fields: int  # F
    n_dense: int  # number of dense features (may be 0)
    embed_dim: int  # D
    GROUPS: ClassVar[tuple[str, ...]] = ("wide", "emb")

    @classmethod
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> FM:
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense, embed_dim=cfg.embed_dim)

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array) -> jax.Array:
        check_inputs("fm", acts, dense, {"wide": 1, "emb": self.embed_dim},
                     self.n_fields, self.n_dense)
        w0 = self.param("bias", nn.initializers.zeros, ())
        linear = w0 + first_order(acts["wide"]) + dense_linear(self, dense, self.n_dense)
        return linear + fm_second_order(acts["emb"])
