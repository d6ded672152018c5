"""Logistic regression over one-hot fields and dense features."""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from recjax.features import FeatureSpec
from recjax.models.config import ModelConfig
from recjax.models.ops import check_inputs, first_order


def dense_linear(module: nn.Module, dense: jax.Array, n_dense: int) -> jax.Array:
    """``dense @ dense_w``: the linear term over dense features, creating param ``dense_w``.

    Call from inside a compact ``__call__``. With no dense features it creates no parameter and
    returns 0, so Avazu/Frappe/MovieLens models carry no empty arrays.

    Args:
      module: the module that owns the parameter.
      dense: f32[B, n_dense].
      n_dense: number of dense features.

    Returns:
      f32[B], or the scalar 0. when ``n_dense == 0``.
    """
    if n_dense == 0:
        return jnp.zeros((), dense.dtype)
    # Zero init: the linear part of LR/FM is convex, and zero is its customary start.
    w = module.param("dense_w", nn.initializers.zeros, (n_dense,))
    return dense @ w


class LR(nn.Module):
    """Logistic regression: ``logit = b + sum_f w_f + dense @ w_d``.

    Parameters: ``bias`` f32[], ``dense_w`` f32[n_dense] (absent when n_dense == 0). The field
    weights w_f are the dim-1 ``"wide"`` tables, looked up outside the model.

    References:
      Rong et al., SIGIR 2020, Sec. 4.1 (LR as a DES workload).
    """

    n_fields: int  # F
    n_dense: int  # number of dense features (may be 0)
    GROUPS: ClassVar[tuple[str, ...]] = ("wide",)

    @classmethod
    def from_config(cls, cfg: ModelConfig, spec: FeatureSpec) -> LR:
        return cls(n_fields=spec.n_fields, n_dense=spec.n_dense)

    @nn.compact
    def __call__(self, acts: dict[str, jax.Array], dense: jax.Array) -> jax.Array:
        check_inputs("lr", acts, dense, {"wide": 1}, self.n_fields, self.n_dense)
        b = self.param("bias", nn.initializers.zeros, ())
        return b + first_order(acts["wide"]) + dense_linear(self, dense, self.n_dense)
