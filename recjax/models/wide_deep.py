"""Wide & Deep (Cheng et al. 2016)."""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax

from recjax.features import FeatureSpec
from recjax.models.config import ModelConfig
from recjax.models.lr import dense_linear
from recjax.models.ops import MLP, check_inputs, first_order, flatten_inputs, mlp_options


class WideDeep(nn.Module):
    """``logit = [sum_f w_f + dense @ w_d] + MLP(concat(flatten(emb), dense))``.

    The wide part is the first-order term over the fields plus a linear term over the dense
    features; the paper's hand-made cross-product transformations are left to feature
    engineering (they would be extra hashed fields). Its single bias b (Eq. 3) is the bias of the
    deep tower's 1-unit output layer.

    Parameters: ``dense_w`` f32[n_dense] (absent when n_dense == 0); ``deep``: `MLP` of widths
    ``deep_mlp + (1,)``, ``layer_0 .. layer_n`` with ``layer_0.kernel`` of shape
    ``[F * D + n_dense, deep_mlp[0]]`` (field-major rows, see `ops.flatten_inputs`).

    References:
      Cheng et al., "Wide & Deep Learning for Recommender Systems", DLRS 2016, Eq. 3.
    """

    n_fields: int  # F
    n_dense: int  # number of dense features (may be 0)
    embed_dim: int  # D
    deep_mlp: tuple[int, ...]  # hidden widths of the deep tower
    dropout: float = 0.0  # dropout after every hidden MLP layer (model.dropout)
    batch_norm: bool = False  # batch norm in every hidden MLP layer (model.batch_norm)
    bn_momentum: float = 0.9  # running-average decay of the batch norms
    GROUPS: ClassVar[tuple[str, ...]] = ("wide", "emb")

    @classmethod
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> WideDeep:
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense, embed_dim=cfg.embed_dim,
                   deep_mlp=cfg.deep_mlp, **mlp_options(cfg))

    @property
    def _mlp(self) -> dict:
        return dict(dropout=self.dropout, batch_norm=self.batch_norm, bn_momentum=self.bn_momentum)

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array,
                 train: bool = False) -> jax.Array:
        check_inputs("wide_deep", acts, dense, {"wide": 1, "emb": self.embed_dim},
                     self.n_fields, self.n_dense)
        wide = first_order(acts["wide"]) + dense_linear(self, dense, self.n_dense)
        deep = MLP((*self.deep_mlp, 1), name="deep", **self._mlp)(
            flatten_inputs(acts["emb"], dense), train)
        return wide + deep[:, 0]
