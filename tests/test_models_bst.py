"""BST (recjax/models/bst.py) against the float64 numpy reference written from the paper
(tests/reference_bst.py: Chen et al. 2019, Eq. 1-6, every gradient by hand, each example's
tokens the target and its first len behaviours only): forward, gradients and one SGD step, with
and without padding; one step of the jitted trainer on a padded batch, embedding rows included;
padded positions change nothing (hypothesis); every algorithm trains it or refuses it."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.train_main import main
from recjax import configs
from recjax.config import DenseOptimConfig
from recjax.embeddings import SparseOptimConfig
from recjax.models import ModelConfig, bce_loss, build_model
from recjax.models.sequence import sequences, unroll_spec
from recjax.train.setup import build
from recjax.train.step import jit_train_step
from tests.conftest import data_path
from tests.reference_models import reference
from tests.test_models_din import SPEC_MULTI, _batch, _spec

B, D, L, LR = 6, 3, 4, 0.1
RTOL = ATOL = 1e-5


def _cfg(**kw):
    base = dict(name="bst", embed_dim=D, deep_mlp=(5,), bst_heads=2, bst_pos_dim=3, bst_ffn=7)
    return ModelConfig(**{**base, **kw})


CASES = {  # config, n_dense, two sequences
    "one-sequence": (_cfg(), 2, False),
    "two-sequences-three-heads": (_cfg(bst_heads=3), 2, True),  # d = 2 * 3 + 3 = 9
    "two-blocks-no-tower": (_cfg(bst_blocks=2, deep_mlp=()), 0, False),
    "no-position-one-head": (_cfg(bst_pos_dim=0, bst_heads=1, deep_mlp=(4, 3)), 1, False),
}


def _seqs(spec):
    return tuple((s.positions, s.target) for s in sequences(spec))


def _setup(case: str, seed: int = 0):
    """Model, random params (biases and norms too, so each term takes part), inputs."""
    cfg, n_dense, two = CASES[case]
    spec = _spec(n_dense, two)
    model = build_model(cfg, spec)
    rng = np.random.default_rng(seed)
    acts = {"emb": jnp.asarray(rng.normal(size=(B, spec.n_fields, D)), jnp.float32)}
    dense = jnp.asarray(rng.normal(size=(B, n_dense)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 2, size=B), jnp.float32)
    shapes = jax.eval_shape(model.init, jax.random.key(seed), acts, dense)["params"]
    params = jax.tree.map(lambda s: jnp.asarray(
        rng.normal(size=s.shape) * (s.shape[0] ** -0.5 if len(s.shape) == 2 else 0.3),
        jnp.float32), shapes)
    return spec, cfg, model, params, acts, dense, labels


def _pad(spec, acts, lengths):
    """Zero each example's positions from its length on (what the masked lookup gives)."""
    emb = np.asarray(acts["emb"]).copy()
    for positions, _ in _seqs(spec):
        for i, n in enumerate(lengths):
            emb[i, list(positions[n:])] = 0.0
    return {"emb": jnp.asarray(emb)}


def _check_against_numpy(spec, cfg, model, params, acts, dense, labels, lengths=None):
    def loss(p, a):
        return bce_loss(model.apply({"params": p}, a, dense), labels)

    kw = dict(sequences=_seqs(spec), heads=cfg.bst_heads, lengths=lengths)
    logits = model.apply({"params": params}, acts, dense)
    value, (g_params, g_acts) = jax.value_and_grad(loss, argnums=(0, 1))(params, acts)
    ref_loss, ref_logits, ref_g, ref_g_acts = reference("bst", params, acts, dense, labels, **kw)
    np.testing.assert_allclose(np.asarray(logits), ref_logits, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(value), ref_loss, rtol=RTOL, atol=ATOL)
    assert jax.tree.structure(g_params) == jax.tree.structure(
        jax.tree.map(lambda x: 0, ref_g, is_leaf=lambda x: isinstance(x, np.ndarray)))
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(g_params),
                                 jax.tree.leaves(ref_g)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL,
                                   err_msg=jax.tree_util.keystr(path))
    np.testing.assert_allclose(np.asarray(g_acts["emb"]), ref_g_acts["emb"], rtol=RTOL, atol=ATOL)
    # one SGD step, and the loss there, agree too
    new = jax.tree.map(lambda p, g: p - LR * g, params, g_params)
    ref_new = jax.tree.map(lambda p, g: np.asarray(p, np.float64) - LR * g, params, ref_g)
    after = reference("bst", ref_new, acts, dense, labels, **kw)[0]
    np.testing.assert_allclose(float(loss(new, acts)), after, rtol=RTOL, atol=ATOL)
    assert after < ref_loss


@pytest.mark.parametrize("case", CASES)
def test_forward_gradients_and_sgd_step_match_numpy(case):
    _check_against_numpy(*_setup(case))


@pytest.mark.parametrize("case", ["one-sequence", "two-sequences-three-heads",
                                  "two-blocks-no-tower"])
def test_padded_sequences_match_numpy_on_the_truncated_ones(case):
    """Positions past each example's length are zero (the masked lookup); the model equals the
    reference that never sees them (lengths 0 and L included)."""
    spec, cfg, model, params, acts, dense, labels = _setup(case, seed=1)
    lengths = [0, 1, 4, 2, 3, 1]
    _check_against_numpy(spec, cfg, model, params, _pad(spec, acts, lengths), dense, labels,
                         lengths)


def test_attention_reads_order_and_every_behaviour():
    """Swapping two behaviours changes the logit (the position embedding), and so does changing
    one behaviour: each token reaches the output through the attention."""
    spec, cfg, model, params, acts, dense, _ = _setup("one-sequence")
    base = np.asarray(model.apply({"params": params}, acts, dense))
    pos = sequences(spec)[0].positions
    emb = np.asarray(acts["emb"]).copy()
    emb[:, [pos[0], pos[1]]] = emb[:, [pos[1], pos[0]]]
    swapped = np.asarray(model.apply({"params": params}, {"emb": jnp.asarray(emb)}, dense))
    assert np.abs(swapped - base).min() > 1e-6
    emb = np.asarray(acts["emb"]).copy()
    emb[:, pos[3]] += 0.5
    changed = np.asarray(model.apply({"params": params}, {"emb": jnp.asarray(emb)}, dense))
    assert np.abs(changed - base).min() > 1e-6


def _trainer():
    cfg = configs.smoke()
    return dataclasses.replace(
        cfg, model=_cfg(deep_mlp=(4,)),
        dense=DenseOptimConfig(name="sgd", lr=LR), sparse=SparseOptimConfig(name="sgd", lr=0.3),
        embed=dataclasses.replace(cfg.embed, init="0.5"))


def test_one_trainer_step_matches_numpy_with_padding():
    """The jitted train step (masked lookup, BST, dense SGD, sparse SGD) on a padded batch
    against the reference on each example's truncated sequence."""
    spec = unroll_spec(SPEC_MULTI)
    model, tx, sopt, state = build(_trainer(), spec)
    rng = np.random.default_rng(1)
    lengths = [0, 1, 4, 2, 3, 1, 4]
    batch = _batch(rng, SPEC_MULTI, lengths, garbage=5)
    tables0 = {k: np.asarray(v, np.float64) for k, v in state.tables.items()}
    params0 = jax.tree.map(np.asarray, state.params)
    new, m = jit_train_step(model, tx, sopt)(state, batch)

    table_of = [f.table for f in spec.fields]
    acts = {"emb": np.stack([tables0[f"emb/{table_of[f]}"][batch.ids[:, f, 0]]
                             for f in range(spec.n_fields)], axis=1)}
    loss, _, g, g_acts = reference("bst", params0, acts, batch.dense, batch.label,
                                   sequences=_seqs(spec), heads=2, lengths=lengths)
    np.testing.assert_allclose(float(m.loss), loss, rtol=1e-5)
    for (path, got), p0, gp in zip(jax.tree_util.tree_leaves_with_path(new.params),
                                   jax.tree.leaves(params0), jax.tree.leaves(g)):
        np.testing.assert_allclose(got, p0 - LR * gp, rtol=1e-5, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
    want = {k: v.copy() for k, v in tables0.items()}
    for i, n in enumerate(lengths):  # the real positions only: user, item, hist@0..n-1
        for f in [0, 1, *range(2, 2 + n)]:
            want[f"emb/{table_of[f]}"][batch.ids[i, f, 0]] -= 0.3 * g_acts["emb"][i, f]
    for k, v in want.items():
        np.testing.assert_allclose(new.tables[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


_STEP = {}


def _step():
    if not _STEP:
        model, tx, sopt, state = build(_trainer(), unroll_spec(SPEC_MULTI))
        _STEP["s"] = (jit_train_step(model, tx, sopt), jax.tree.map(np.asarray, state))
    step, host = _STEP["s"]
    return step, jax.tree.map(jnp.array, host)  # the step donates its state: a fresh copy


@settings(max_examples=10, deadline=None)
@given(lengths=st.lists(st.integers(0, L), min_size=5, max_size=5),
       garbage=st.integers(0, 2**16), seed=st.integers(0, 2**16))
def test_padded_positions_contribute_nothing(lengths, garbage, seed):
    """Whatever ids sit at masked positions, the step's loss, dense update and every table row
    are the same, bit for bit; a row looked up only at padded positions is not touched."""
    a = _batch(np.random.default_rng(seed), SPEC_MULTI, lengths, garbage)
    b = _batch(np.random.default_rng(seed), SPEC_MULTI, lengths, garbage + 1)
    step, state = _step()
    before = np.asarray(state.tables["emb/item"])
    new_a, ma = step(state, a)
    new_b, mb = _step()[0](_step()[1], b)
    assert float(ma.loss) == float(mb.loss)
    for x, y in zip(jax.tree.leaves((new_a.params, new_a.tables)),
                    jax.tree.leaves((new_b.params, new_b.tables))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    real = {int(i) for i in np.concatenate([a.ids[:, 1, 0], a.ids[:, 2:, 0][a.mask[:, 2:, 0] > 0]])}
    untouched = [r for r in range(9) if r not in real]
    np.testing.assert_array_equal(np.asarray(new_a.tables["emb/item"])[untouched],
                                  before[untouched])


def test_bad_settings_are_refused_with_the_reason():
    spec = _spec(two=True)
    with pytest.raises(ValueError, match=r"2 sequence\(s\) x model.embed_dim 3 \+ "
                                         r"model.bst_pos_dim 3 = 9 wide.*bst_heads=2"):
        build_model(_cfg(bst_heads=2), spec)
    with pytest.raises(ValueError, match="bst: the data has no behaviour sequence"):
        build_model(_cfg(), unroll_spec(SPEC_MULTI.__class__((), SPEC_MULTI.fields[:2])))
    with pytest.raises(ValueError, match="model.bst_heads must be >= 1"):
        _cfg(bst_heads=0)
    with pytest.raises(ValueError, match="model.bst_pos_dim must be >= 0"):
        _cfg(bst_pos_dim=-1)


def test_bst_trains_on_taobao_from_the_cli(tmp_path):
    """``--model bst`` on the Taobao sample's click sequence (one sequence: tokens of D + P), end
    to end from the CLI."""
    train = data_path("taobao_ad_tiny", "train_sample.csv")
    valid = data_path("taobao_ad_tiny", "valid_sample.csv")
    assert main(["--config", "smoke", "--model", "bst", "--data", f"seq:taobao:{train}",
                 "--eval-data", f"seq:taobao:{valid}", "--data.multi_hot_len=8",
                 "--data.hash_buckets=4096", "--batch-size", "16", "--epochs", "2", "--seed", "1",
                 "--out", str(tmp_path), "--no-progress"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["model"] == "bst" and s["steps"] == 12 and s["eval_examples"] == 100
    assert np.isfinite(s["train_ne"]) and np.isfinite(s["eval_ne"])
