"""CTR models: the dense part of the sparse/dense split (DESIGN.md section 1).

Embedding lookups happen outside the model. A model is a Flax module called as
``model.apply(variables, acts, dense) -> logits f32[B]`` where

* ``acts`` maps an activation group to the looked-up, pooled activations ``f32[B, F, Dg]``:
  ``"emb"`` -> ``[B, F, embed_dim]``, ``"wide"`` -> ``[B, F, 1]`` (first-order weights), F and
  the field order as in ``FeatureSpec.fields``; `embedding_groups` says which groups a model
  reads (extra groups are ignored);
* ``dense`` is ``f32[B, n_dense]``, possibly with n_dense = 0.

``jax.value_and_grad(loss, argnums=(0, 1))`` over ``(params, acts)`` then gives the dense
gradient and the activation gradient that the sparse update scatters into the tables.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from recjax.features import FeatureSpec
from recjax.models.bst import BST
from recjax.models.config import MODEL_NAMES, SEQUENCE_MODEL_NAMES, ModelConfig
from recjax.models.dcn import DCN
from recjax.models.dcn_v2 import DCNv2
from recjax.models.deepfm import DeepFM
from recjax.models.din import DIN
from recjax.models.dlrm import DLRM
from recjax.models.fm import FM
from recjax.models.lr import LR
from recjax.models.wide_deep import WideDeep

# name -> module class; each class has `from_config(cfg, spec)` and `GROUPS`.
MODELS: dict[str, type[nn.Module]] = {
    "lr": LR,
    "fm": FM,
    "wide_deep": WideDeep,
    "deepfm": DeepFM,
    "dlrm": DLRM,
    "dcn": DCN,
    "dcn_v2": DCNv2,
}
assert tuple(MODELS) == MODEL_NAMES, "MODELS and config.MODEL_NAMES must list the same models"
# name -> module class of the models that need a behaviour sequence (recjax/models/sequence.py)
SEQUENCE_MODELS: dict[str, type[nn.Module]] = {"din": DIN, "bst": BST}
assert tuple(SEQUENCE_MODELS) == SEQUENCE_MODEL_NAMES, "and SEQUENCE_MODELS the sequence models"

_CLASSES = {**MODELS, **SEQUENCE_MODELS}

__all__ = ["MODELS", "SEQUENCE_MODELS", "ModelConfig", "bce_loss", "build_model", "dummy_inputs",
           "embedding_groups", "BST", "DCN", "DCNv2", "DIN", "DLRM", "DeepFM", "FM", "LR", "WideDeep"]


def build_model(cfg: ModelConfig, spec: FeatureSpec) -> nn.Module:
    """The Flax module for ``cfg.name`` sized for the dataset ``spec``.

    Args:
      cfg: model configuration.
      spec: the dataset's features; gives F (``spec.n_fields``) and ``spec.n_dense``.

    Returns:
      A module whose ``__call__(acts, dense)`` returns logits f32[B].
    """
    return _CLASSES[cfg.name].from_config(cfg, spec)


def embedding_groups(cfg: ModelConfig) -> dict[str, int]:
    """Activation groups the model reads, with their embedding dim.

    ``lr -> {"wide": 1}``; ``fm, wide_deep, deepfm -> {"wide": 1, "emb": D}``;
    ``dlrm, dcn, dcn_v2, din, bst -> {"emb": D}``. The embedding side builds one table set per group.
    """
    return {g: 1 if g == "wide" else cfg.embed_dim for g in _CLASSES[cfg.name].GROUPS}


def dummy_inputs(cfg: ModelConfig, spec: FeatureSpec,
                 batch_size: int = 1) -> tuple[dict[str, jax.Array], jax.Array]:
    """Zero ``(acts, dense)`` of the right shapes, for ``model.init`` or ``jax.eval_shape``."""
    acts = {g: jnp.zeros((batch_size, spec.n_fields, d), jnp.float32)
            for g, d in embedding_groups(cfg).items()}
    return acts, jnp.zeros((batch_size, spec.n_dense), jnp.float32)


def bce_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean sigmoid binary cross entropy, stable for any logit.

    ``-y log s(x) - (1-y) log(1-s(x)) = softplus(x) - x y``. ``jax.nn.softplus`` is
    ``logaddexp(x, 0)``: no exp of a large positive number, no log of 0, and a custom JVP that
    is exactly ``sigmoid(x)``, so the gradient is ``(sigmoid(x) - y) / B`` everywhere. (The
    spelled-out ``max(x, 0) - x y + log1p(exp(-|x|))`` has the wrong gradient at x = 0, since
    JAX's d|x|/dx there is 1, and x = 0 is exactly where a zero-initialised LR starts.)

    Args:
      logits: f32[B].
      labels: f32[B] in [0, 1].

    Returns:
      f32[] the mean over the batch.
    """
    labels = labels.astype(logits.dtype)
    return jnp.mean(jax.nn.softplus(logits) - logits * labels)
