"""Per-table embedding dims (embed.dims): table shapes, the zero-padded activations, the row
gradients, a training run, and the models / algorithms that refuse them."""

import dataclasses

import jax
import numpy as np
import pytest

from recjax import configs
from recjax.config import Config, ConfigError, apply_overrides
from recjax.embeddings import lookup, row_gradients
from recjax.models.config import ModelConfig
from recjax.train.features import parse_dims, table_dims
from recjax.train.loop import run
from recjax.train.setup import build, make_model
from tests.test_features_defaults import SPEC, _batch


def _cfg(dims: str, name: str = "wide_deep"):
    cfg = configs.smoke()
    return dataclasses.replace(cfg, model=dataclasses.replace(ModelConfig.smoke(name), embed_dim=6),
                               embed=dataclasses.replace(cfg.embed, dims=dims))


def test_rules_first_match_wins_and_bounds():
    assert parse_dims("C1|C2:32; C.*:4") == (("C1|C2", 32), ("C.*", 4))
    assert table_dims("a.*:2;.*:3", ["ac", "b"], 6) == {"ac": 2, "b": 3}
    assert table_dims("b:4", ["ac", "b"], 6) == {"ac": 6, "b": 4}  # unmatched: model.embed_dim
    with pytest.raises(ValueError, match="> model.embed_dim=6"):
        table_dims("b:8", ["ac", "b"], 6)
    for bad, why in (("C1", "regex:dim"), ("C1:x", "integer >= 1"), ("C1:0", "integer >= 1"),
                     ("(:3", "bad regex")):
        with pytest.raises(ConfigError, match=why):
            apply_overrides(Config(), [("embed.dims", bad)])


def test_shapes_padding_and_row_gradients():
    model, tx, sopt, state = build(_cfg("ac:2"), SPEC)
    assert state.tables["emb/ac"].shape == (6, 2) and state.tables["emb/b"].shape == (4, 6)
    assert state.tables["wide/ac"].shape == (6, 1)  # wide tables stay dim 1
    batch = _batch(5)
    acts = lookup(model.layout, state.tables, batch.ids, batch.mask)["emb"]
    assert acts.shape == (5, 3, 6)
    t = np.asarray(state.tables["emb/ac"])
    for f in (0, 2):  # fields a and c read table ac: its 2 columns, then zeros
        np.testing.assert_array_equal(np.asarray(acts[:, f, :2]), t[batch.ids[:, f, 0]])
        np.testing.assert_array_equal(np.asarray(acts[:, f, 2:]), 0.0)
    g = {"emb": np.arange(5 * 3 * 6, dtype=np.float32).reshape(5, 3, 6),
         "wide": np.zeros((5, 3, 1), np.float32)}
    ids, rows = row_gradients(model.layout, g, batch.ids, batch.mask)["emb/ac"]
    assert rows.shape == (10, 2)  # the padding's gradient is dropped
    np.testing.assert_array_equal(np.asarray(rows), g["emb"][:, [0, 2], :2].reshape(10, 2))
    assert np.asarray(ids).tolist() == batch.ids[:, [0, 2], 0].reshape(-1).tolist()


def test_deep_tower_of_padded_fields_is_the_tower_of_the_narrow_fields():
    """The zero columns add nothing: perturbing the kernel rows they meet leaves the logits."""
    model, tx, sopt, state = build(_cfg("ac:2"), SPEC)
    batch = _batch(5)
    acts = lookup(model.layout, state.tables, batch.ids, batch.mask)
    base = np.asarray(model.logits(state.params, acts, batch.dense))
    k = np.asarray(state.params["deep"]["layer_0"]["kernel"]).copy()
    for f in (0, 2):
        k[f * 6 + 2:(f + 1) * 6] += 100.0
    params = jax.tree.map(lambda x: x, state.params)
    params["deep"]["layer_0"]["kernel"] = k
    np.testing.assert_array_equal(np.asarray(model.logits(params, acts, batch.dense)), base)


@pytest.mark.parametrize("name", ["wide_deep", "dcn"])
def test_training_run_with_per_table_dims(name):
    cfg = apply_overrides(configs.smoke(), [
        ("model.name", name), ("model.embed_dim", "8"), ("embed.dims", "C1:2;C2:4"),
        ("train.steps", "30"), ("train.batch_size", "128"), ("train.progress", "false"),
        ("train.eval_batch_size", "2048")])
    cfg = dataclasses.replace(cfg, synthetic=dataclasses.replace(cfg.synthetic, n_eval=2048))
    summary = run(cfg)
    tabs = summary["final_state"].tables
    assert tabs["emb/C1"].shape[1] == 2 and tabs["emb/C2"].shape[1] == 4
    assert tabs["emb/C3"].shape[1] == 8
    assert summary["steps"] == 30 and summary["eval_auc"] > 0.6 and summary["eval_ne"] < 1.0


@pytest.mark.parametrize("name", ["dlrm", "fm", "deepfm", "lr"])
def test_models_with_pairwise_products_refuse(name):
    with pytest.raises(ValueError, match="embed.dims .* is for wide_deep and dcn"):
        make_model(_cfg("ac:2", name), SPEC)


def test_algorithms_other_than_single_refuse():
    cfg = _cfg("ac:2")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, algo="sync"))
    with pytest.raises(ValueError, match="embed.dims runs with --algo single"):
        make_model(cfg, SPEC)
