"""Configuration of the dense part of a CTR model (interaction + MLPs).

Defaults follow the DLRM Criteo-Kaggle configuration of Naumov et al. (2019): dense features
13-512-256-64-16 through the bottom MLP, 27 vectors of dim 16 into the dot interaction
(351 pairs + 16 = 367 inputs), then 367-512-256-1 through the top MLP.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from recjax.config_fields import check_choices

# The models over any FeatureSpec (one activation per field); `recjax.models.MODELS` maps each to
# its module class.
MODEL_NAMES = ("lr", "fm", "wide_deep", "deepfm", "dlrm", "dcn", "dcn_v2")
# The models that also need a behaviour sequence in the data (position fields,
# recjax/models/sequence.py); `recjax.models.SEQUENCE_MODELS` maps each to its class. `--model`
# accepts both lists.
SEQUENCE_MODEL_NAMES = ("din", "bst")


def _layer_sizes(field: str, value) -> tuple[int, ...]:
    """Coerce an override (a list from JSON or the CLI) to a tuple and check each width."""
    sizes = tuple(int(n) for n in value)
    if any(n < 1 for n in sizes):
        raise ValueError(f"model.{field}: every layer width must be >= 1, got {value!r}")
    return sizes


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Which model to build and the sizes of its dense layers.

    Attributes:
      name: model family: ``lr | fm | wide_deep | deepfm | dlrm | dcn | dcn_v2 | din | bst``.
      embed_dim: D, the width of every field's embedding (group ``"emb"``).
      bottom_mlp: DLRM hidden widths over the dense features; the bottom MLP is
        ``bottom_mlp + (embed_dim,)`` so its output can join the dot interaction.
      top_mlp: DLRM hidden widths after the interaction; a final 1-unit linear layer is added.
      deep_mlp: hidden widths of the deep tower of Wide&Deep, DeepFM, DCN, DCN-v2, DIN and BST.
      cross_layers: number of DCN / DCN-v2 cross layers (0 leaves x0 unchanged: a deep +
        linear model).
      cross_rank: DCN-v2: 0 = full-rank cross matrices W_l (K x K, Eq. 1); r > 0 = low rank
        U_l V_l^T (K x r each; Sec. 5.1), K = fields x embed_dim + dense features.
      cross_experts: DCN-v2: low-rank experts per cross layer mixed by a softmax gate (Eq. 4-5;
        > 1 needs cross_rank > 0); 1 = no mixture.
      cross_structure: DCN-v2: stacked (the deep tower reads the cross network's output) |
        parallel (both read x0, their outputs concatenated; DCN-v1's layout). Sec. 3.
      att_mlp: DIN: hidden widths of the local activation unit (PReLU after each; Zhou et al.
        2018, Fig. 2 draws one layer of 36).
      din_pooling: DIN: attention (the weighted sum of Eq. 3) | sum (every weight 1: the
        paper's BaseModel, the baseline of docs/models.md).
      bst_heads: BST: attention heads h; they must divide a token's width d = sequences x
        embed_dim + bst_pos_dim (Chen et al. 2019, Table 1: 8).
      bst_blocks: BST: transformer blocks stacked (Eq. 6; Table 1: 1).
      bst_ffn: BST: width of the feed-forward layer W^(1) (Eq. 5); 0 = 4 d.
      bst_pos_dim: BST: width P of the learned position embedding concatenated to each token
        (Sec. 2.1); 0 = no position feature.
      interaction_self: DLRM only: also include the i == j dot products (N(N+1)/2 pairs instead
        of the strictly upper N(N-1)/2).
      dropout: dropout rate p in [0, 1) after every hidden MLP layer (FuxiCTR's ``net_dropout``);
        kept units are scaled by 1/(1-p) in training, no dropout in eval. 0 = off. Models with
        an MLP only (wide_deep, deepfm, dlrm, dcn); --algo single or sync.
      batch_norm: batch normalisation after every hidden MLP layer's Dense, before its ReLU
        (FuxiCTR's ``batch_norm``, its MLP_Block order Dense -> BN -> ReLU -> Dropout); batch
        statistics in training, running averages (momentum ``bn_momentum``) in eval; the running
        averages are part of the train state and of every checkpoint. Models with an MLP only;
        --algo single or sync.
      bn_momentum: decay of the batch-norm running averages (Flax convention: new = m * old +
        (1 - m) * batch; 0.9 = PyTorch's momentum 0.1).
    """

    name: Literal[MODEL_NAMES + SEQUENCE_MODEL_NAMES] = dataclasses.field(  # model family
        default="dlrm", metadata={"unknown": "model"})
    embed_dim: int = 16  # D: embedding width of every field
    bottom_mlp: tuple[int, ...] = (512, 256, 64)  # DLRM bottom hidden widths; + (embed_dim,)
    top_mlp: tuple[int, ...] = (512, 256)  # DLRM top hidden widths; + a 1-unit output layer
    deep_mlp: tuple[int, ...] = (400, 400)  # deep tower of wide_deep / deepfm / dcn
    cross_layers: int = 3  # DCN: number of cross layers
    cross_rank: int = 0  # DCN-v2: 0 = full-rank cross matrices, r = low rank
    cross_experts: int = 1  # DCN-v2: low-rank experts per cross layer (mixture if > 1)
    cross_structure: Literal["stacked", "parallel"] = "stacked"  # DCN-v2: cross then deep, or both
    att_mlp: tuple[int, ...] = (36,)  # DIN: hidden widths of the activation unit
    din_pooling: Literal["attention", "sum"] = "attention"  # DIN: Eq. 3, or sum pooling
    bst_heads: int = 8  # BST: attention heads (must divide the token width)
    bst_blocks: int = 1  # BST: transformer blocks
    bst_ffn: int = 0  # BST: feed-forward width (0 = 4 x token width)
    bst_pos_dim: int = 8  # BST: position embedding width (0 = none)
    interaction_self: bool = False  # DLRM: include the i == j pairs in the dot interaction
    dropout: float = 0.0  # dropout rate after every hidden MLP layer (0 = off)
    batch_norm: bool = False  # batch norm after every hidden MLP layer's Dense
    bn_momentum: float = 0.9  # decay of the batch-norm running averages

    def __post_init__(self):
        check_choices(self, "model")
        if self.embed_dim < 1:
            raise ValueError(f"model.embed_dim must be >= 1, got {self.embed_dim}")
        for field in ("bottom_mlp", "top_mlp", "deep_mlp", "att_mlp"):
            # Frozen: write the normalised tuple back through object.__setattr__.
            object.__setattr__(self, field, _layer_sizes(field, getattr(self, field)))
        if self.cross_layers < 0:
            raise ValueError(f"model.cross_layers must be >= 0, got {self.cross_layers}")
        if self.cross_rank < 0:
            raise ValueError(f"model.cross_rank must be >= 0 (0 = full rank), got "
                             f"{self.cross_rank}")
        if self.cross_experts < 1 or (self.cross_experts > 1 and not self.cross_rank):
            raise ValueError(f"model.cross_experts must be >= 1, and > 1 (a mixture of low-rank "
                             f"experts) needs model.cross_rank > 0; got cross_experts="
                             f"{self.cross_experts}, cross_rank={self.cross_rank}")
        for field in ("bst_heads", "bst_blocks"):
            if getattr(self, field) < 1:
                raise ValueError(f"model.{field} must be >= 1, got {getattr(self, field)}")
        for field in ("bst_ffn", "bst_pos_dim"):
            if getattr(self, field) < 0:
                raise ValueError(f"model.{field} must be >= 0 (0 = the default), got "
                                 f"{getattr(self, field)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1) (a rate; 0 = off), got {self.dropout}")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise ValueError(f"model.bn_momentum must be in [0, 1), got {self.bn_momentum}")

    @property
    def bottom_layers(self) -> tuple[int, ...]:
        """The DLRM bottom MLP widths including the forced last layer of width ``embed_dim``."""
        return (*self.bottom_mlp, self.embed_dim)

    @classmethod
    def smoke(cls, name: str = "dlrm") -> ModelConfig:
        """A small configuration of ``name`` that trains on a laptop CPU in seconds."""
        return cls(name=name, embed_dim=8, bottom_mlp=(32, 16), top_mlp=(32, 16),
                   deep_mlp=(32, 32), cross_layers=2, att_mlp=(16,), bst_heads=2)
