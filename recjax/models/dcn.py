"""Deep & Cross Network (Wang et al. 2017)."""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from recjax.features import FeatureSpec
from recjax.models.config import ModelConfig
from recjax.models.ops import MLP, check_inputs, cross_layer, flatten_inputs, mlp_options


class DCN(nn.Module):
    """Cross network and deep tower side by side over ``x0 = concat(flatten(emb), dense)``.

    ``x_{l+1} = x0 * (x_l . w_l) + b_l + x_l`` for l < cross_layers (Eq. 3), a ReLU tower
    ``h = MLP(deep_mlp)(x0)`` (Eq. 4), and ``logit = [x_L, h] . w_logit + b_logit`` (Eq. 5
    before the sigmoid). With an empty ``deep_mlp`` the model is the cross network alone.

    Parameters (K = F * D + n_dense): ``cross_w`` f32[L, K] and ``cross_b`` f32[L, K] (row l is
    w_l, b_l); ``deep``: `MLP` of widths ``deep_mlp``, all ReLU (absent if deep_mlp is empty);
    ``out``: ``kernel`` f32[K + deep_mlp[-1], 1], ``bias`` f32[1].

    References:
      Wang et al., "Deep & Cross Network for Ad Click Predictions", ADKDD 2017, Eq. 3-5.
    """

    n_fields: int  # F
    n_dense: int  # number of dense features (may be 0)
    embed_dim: int  # D
    deep_mlp: tuple[int, ...]  # hidden widths of the deep tower (all ReLU)
    cross_layers: int  # L
    dropout: float = 0.0  # dropout after every hidden MLP layer (model.dropout)
    batch_norm: bool = False  # batch norm in every hidden MLP layer (model.batch_norm)
    bn_momentum: float = 0.9  # running-average decay of the batch norms
    GROUPS: ClassVar[tuple[str, ...]] = ("emb",)

    @classmethod
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> DCN:
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense, embed_dim=cfg.embed_dim,
                   deep_mlp=cfg.deep_mlp, cross_layers=cfg.cross_layers, **mlp_options(cfg))

    @property
    def _mlp(self) -> dict:
        return dict(dropout=self.dropout, batch_norm=self.batch_norm, bn_momentum=self.bn_momentum)

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array,
                 train: bool = False) -> jax.Array:
        check_inputs("dcn", acts, dense, {"emb": self.embed_dim}, self.n_fields, self.n_dense)
        x0 = flatten_inputs(acts["emb"], dense)
        k = x0.shape[1]
        # w_l must not start at zero: with w = 0 every cross layer is the constant shift x + b
        # and the gradients w.r.t. x0 through the cross term vanish. 1/sqrt(K) keeps x_l . w_l
        # O(|x|), like a LeCun-normal Dense(1) kernel.
        w = self.param("cross_w", nn.initializers.normal(stddev=k ** -0.5),
                       (self.cross_layers, k))
        b = self.param("cross_b", nn.initializers.zeros, (self.cross_layers, k))
        x = x0
        for layer in range(self.cross_layers):
            x = cross_layer(x0, x, w[layer], b[layer])
        if self.deep_mlp:
            x = jnp.concatenate([x, MLP(self.deep_mlp, last_linear=False, name="deep",
                                        **self._mlp)(x0, train)], 1)
        return nn.Dense(1, name="out")(x)[:, 0]
