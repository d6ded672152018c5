"""DeepFM (Guo et al. 2017)."""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax

from recjax.features import FeatureSpec
from recjax.models.config import ModelConfig
from recjax.models.lr import dense_linear
from recjax.models.ops import MLP, check_inputs, first_order, flatten_inputs, fm_second_order, mlp_options


class DeepFM(nn.Module):
    """``logit = y_FM + y_DNN``, the FM and the deep tower sharing the embeddings.

    ``y_FM = sum_f w_f + dense @ w_d + sum_{i<j} <v_i, v_j>`` (Eq. 2; no bias of its own, as in
    the paper) and ``y_DNN = MLP(concat(flatten(emb), dense))`` (Eq. 3-4), whose 1-unit output
    layer carries the model's bias. Same parameters as `WideDeep`; the difference is the FM
    pairwise term in the "wide" component.

    Parameters: ``dense_w`` f32[n_dense] (absent when n_dense == 0); ``deep``: `MLP` of widths
    ``deep_mlp + (1,)``.

    References:
      Guo et al., "DeepFM: A Factorization-Machine based Neural Network for CTR Prediction",
      IJCAI 2017, Eq. 1-4.
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
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> DeepFM:
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense, embed_dim=cfg.embed_dim,
                   deep_mlp=cfg.deep_mlp, **mlp_options(cfg))

    @property
    def _mlp(self) -> dict:
        return dict(dropout=self.dropout, batch_norm=self.batch_norm, bn_momentum=self.bn_momentum)

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array,
                 train: bool = False) -> jax.Array:
        check_inputs("deepfm", acts, dense, {"wide": 1, "emb": self.embed_dim},
                     self.n_fields, self.n_dense)
        emb = acts["emb"]
        y_fm = (first_order(acts["wide"]) + dense_linear(self, dense, self.n_dense)
                + fm_second_order(emb))
        y_dnn = MLP((*self.deep_mlp, 1), name="deep", **self._mlp)(flatten_inputs(emb, dense),
                                                                   train)
        return y_fm + y_dnn[:, 0]
