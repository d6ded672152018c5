"""DIN (recjax/models/din.py) against the float64 numpy reference written from the paper
(tests/reference_models.py `_din`: Zhou et al. 2018, Eq. 3 and Fig. 2, the activation unit on
the concatenation, every gradient by hand): forward, gradients and one SGD step; one step of the
jitted trainer on a batch whose sequences are padded, embedding rows included; and padded
positions contribute nothing, over random lengths (hypothesis)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjax import configs
from recjax.batch import Batch, Chunk
from recjax.config import DenseOptimConfig
from recjax.embeddings import SparseOptimConfig
from recjax.features import FeatureSpec, FieldSpec
from recjax.models import ModelConfig, bce_loss, build_model
from recjax.models.sequence import sequences, unroll_chunk, unroll_spec
from recjax.train.setup import build
from recjax.train.step import jit_train_step
from tests.reference_models import reference

B, D, L, LR = 6, 3, 4, 0.1
RTOL = ATOL = 1e-5


def _spec(n_dense: int = 2, two: bool = False) -> FeatureSpec:
    """user, item (the target), [cate (the second target)], hist (item's table), [hist_cate]."""
    fields = [FieldSpec("user", 7), FieldSpec("item", 9)]
    if two:
        fields.append(FieldSpec("cate", 5))
    fields.append(FieldSpec("hist", 9, max_len=L, table="item"))
    if two:
        fields.append(FieldSpec("hist_cate", 5, max_len=L, table="cate"))
    return unroll_spec(FeatureSpec(tuple(f"d{i}" for i in range(n_dense)), tuple(fields)))


CASES = {
    "attention": (ModelConfig(name="din", embed_dim=D, att_mlp=(5,), deep_mlp=(6, 4)), 2, False),
    "attention-two-layers": (ModelConfig(name="din", embed_dim=D, att_mlp=(5, 3),
                                         deep_mlp=(4,)), 0, False),
    "two-sequences": (ModelConfig(name="din", embed_dim=D, att_mlp=(4,), deep_mlp=(5,)), 2, True),
    "no-tower": (ModelConfig(name="din", embed_dim=D, att_mlp=(4,), deep_mlp=()), 1, False),
    "linear-unit": (ModelConfig(name="din", embed_dim=D, att_mlp=(), deep_mlp=(4,)), 2, True),
    "sum-pooling": (ModelConfig(name="din", embed_dim=D, deep_mlp=(5,), din_pooling="sum"), 2,
                    False),
}


def _seqs(spec):
    return tuple((s.positions, s.target) for s in sequences(spec))


def _setup(case: str, seed: int = 0):
    """Model, random params (biases and PReLU slopes too, so each term takes part), inputs."""
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
    return spec, model, params, acts, dense, labels


@pytest.mark.parametrize("case", CASES)
def test_forward_gradients_and_sgd_step_match_numpy(case):
    spec, model, params, acts, dense, labels = _setup(case)

    def loss(p, a):
        return bce_loss(model.apply({"params": p}, a, dense), labels)

    logits = model.apply({"params": params}, acts, dense)
    value, (g_params, g_acts) = jax.value_and_grad(loss, argnums=(0, 1))(params, acts)
    ref_loss, ref_logits, ref_g, ref_g_acts = reference("din", params, acts, dense, labels,
                                                        sequences=_seqs(spec))
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
    after = reference("din", ref_new, acts, dense, labels, sequences=_seqs(spec))[0]
    np.testing.assert_allclose(float(loss(new, acts)), after, rtol=RTOL, atol=ATOL)
    assert after < ref_loss


def test_the_unit_reads_each_of_its_four_inputs():
    """Zeroing one block of the first kernel's rows changes the logits: each of e_j, v_A,
    e_j - v_A and e_j * v_A reaches the weights (a dropped term would go unseen otherwise)."""
    spec, model, params, acts, dense, _ = _setup("attention")
    base = np.asarray(model.apply({"params": params}, acts, dense))
    k = D
    for block in range(4):
        p = jax.tree.map(lambda x: x, params)
        kern = np.asarray(p["att"]["layer_0"]["kernel"]).copy()
        kern[block * k:(block + 1) * k] = 0
        p["att"]["layer_0"]["kernel"] = jnp.asarray(kern)
        assert np.abs(np.asarray(model.apply({"params": p}, acts, dense)) - base).max() > 1e-4


def _batch(rng, spec_multi, lengths, garbage: int):
    """A padded batch of `spec_multi` (user, item, hist[L]) with `lengths`, unrolled; the ids
    at padded positions are `garbage` draws (the mask says they are not there)."""
    n = len(lengths)
    ids = np.zeros((n, 3, L), np.int32)
    mask = np.zeros((n, 3, L), np.float32)
    ids[:, 0, 0], ids[:, 1, 0] = rng.integers(0, 7, n), rng.integers(0, 9, n)
    mask[:, :2, 0] = 1
    hist = rng.integers(0, 9, (n, L))
    real = np.arange(L)[None, :] < np.asarray(lengths)[:, None]
    ids[:, 2, :] = np.where(real, hist, np.random.default_rng(garbage).integers(0, 9, (n, L)))
    mask[:, 2, :] = real
    chunk = Chunk(rng.normal(size=(n, 2)).astype(np.float32), ids, mask,
                  (rng.random(n) < 0.5).astype(np.float32), np.arange(n))
    c = unroll_chunk(chunk, spec_multi)
    return Batch(c.dense, c.ids, c.mask, c.label)


def _trainer(pooling="attention"):
    cfg = configs.smoke()
    return dataclasses.replace(
        cfg, model=ModelConfig(name="din", embed_dim=D, att_mlp=(5,), deep_mlp=(4,),
                               din_pooling=pooling),
        dense=DenseOptimConfig(name="sgd", lr=LR), sparse=SparseOptimConfig(name="sgd", lr=0.3),
        embed=dataclasses.replace(cfg.embed, init="0.5"))


SPEC_MULTI = FeatureSpec(("d0", "d1"), (FieldSpec("user", 7), FieldSpec("item", 9),
                                        FieldSpec("hist", 9, max_len=L, table="item")))


@pytest.mark.parametrize("pooling", ["attention", "sum"])
def test_one_trainer_step_matches_numpy_with_padding(pooling):
    """The jitted train step (lookup, DIN, dense SGD, sparse SGD) on a padded batch against the
    reference on each example's *truncated* sequence (its first len positions only)."""
    spec = unroll_spec(SPEC_MULTI)
    model, tx, sopt, state = build(_trainer(pooling), spec)
    rng = np.random.default_rng(1)
    lengths = [0, 1, 4, 2, 3, 1, 4]
    batch = _batch(rng, SPEC_MULTI, lengths, garbage=5)
    tables0 = {k: np.asarray(v, np.float64) for k, v in state.tables.items()}
    params0 = jax.tree.map(np.asarray, state.params)
    new, m = jit_train_step(model, tx, sopt)(state, batch)

    n = len(lengths)
    want_tables = {k: v.copy() for k, v in tables0.items()}
    table_of = [f.table for f in spec.fields]
    g_sum = jax.tree.map(lambda x: np.zeros(x.shape), params0)
    loss_sum = 0.0
    for i, ell in enumerate(lengths):  # example by example, the sequence cut to its length
        keep = [0, 1, *range(2, 2 + ell)]
        acts = {"emb": np.stack([tables0[f"emb/{table_of[f]}"][batch.ids[i, f, 0]]
                                 for f in keep])[None]}
        loss, _, g, g_acts = reference("din", params0, acts, batch.dense[i:i + 1],
                                       batch.label[i:i + 1],
                                       sequences=((tuple(range(2, 2 + ell)), 1),))
        loss_sum += loss
        g_sum = jax.tree.map(lambda a, b: a + b, g_sum, g)
        for j, f in enumerate(keep):  # the mean loss: each example's gradient / n
            want_tables[f"emb/{table_of[f]}"][batch.ids[i, f, 0]] -= 0.3 * g_acts["emb"][0, j] / n
    np.testing.assert_allclose(float(m.loss), loss_sum / n, rtol=1e-5)
    for (path, got), p0, g in zip(jax.tree_util.tree_leaves_with_path(new.params),
                                  jax.tree.leaves(params0), jax.tree.leaves(g_sum)):
        np.testing.assert_allclose(got, p0 - LR * g / n, rtol=1e-5, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
    for k, v in want_tables.items():
        np.testing.assert_allclose(new.tables[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


_STEP = {}


def _step(pooling):
    if pooling not in _STEP:
        model, tx, sopt, state = build(_trainer(pooling), unroll_spec(SPEC_MULTI))
        _STEP[pooling] = (jit_train_step(model, tx, sopt), jax.tree.map(np.asarray, state))
    step, host = _STEP[pooling]
    return step, jax.tree.map(jnp.array, host)  # the step donates its state: a fresh copy


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(0, L), min_size=5, max_size=5),
       garbage=st.integers(0, 2**16), seed=st.integers(0, 2**16),
       pooling=st.sampled_from(["attention", "sum"]))
def test_padded_positions_contribute_nothing(lengths, garbage, seed, pooling):
    """Whatever ids sit at masked positions, the step's loss, dense update and every table row
    are the same (bit for bit) as with other ids there; and a row looked up only at padded
    positions is not touched."""
    a = _batch(np.random.default_rng(seed), SPEC_MULTI, lengths, garbage)
    b = _batch(np.random.default_rng(seed), SPEC_MULTI, lengths, garbage + 1)
    step, state = _step(pooling)
    before = np.asarray(state.tables["emb/item"])
    new_a, ma = step(state, a)
    new_b, mb = _step(pooling)[0](_step(pooling)[1], b)
    assert float(ma.loss) == float(mb.loss)
    for x, y in zip(jax.tree.leaves((new_a.params, new_a.tables)),
                    jax.tree.leaves((new_b.params, new_b.tables))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    real = {int(i) for i in np.concatenate([a.ids[:, 1, 0], a.ids[:, 2:, 0][a.mask[:, 2:, 0] > 0]])}
    untouched = [r for r in range(9) if r not in real]
    np.testing.assert_array_equal(np.asarray(new_a.tables["emb/item"])[untouched],
                                  before[untouched])


def test_sequences_and_their_targets_are_found():
    spec = _spec(two=True)
    found = sequences(spec)
    assert [(s.name, s.target) for s in found] == [("hist", 1), ("hist_cate", 2)]
    assert found[0].positions == (3, 4, 5, 6) and found[1].positions == (7, 8, 9, 10)
    names = [f.name for f in spec.fields]
    assert names[3:7] == ["hist@0", "hist@1", "hist@2", "hist@3"]
    assert {spec.fields[i].table for i in found[0].positions} == {"item"}


def test_bad_layouts_are_refused_with_the_reason():
    cfg = ModelConfig(name="din", embed_dim=D)
    plain = FeatureSpec((), (FieldSpec("a", 3), FieldSpec("b", 3)))
    with pytest.raises(ValueError, match="no behaviour sequence.*seq:KIND:PATH"):
        build_model(cfg, plain)
    no_target = unroll_spec(FeatureSpec((), (FieldSpec("a", 3),
                                             FieldSpec("h", 3, max_len=2))))
    with pytest.raises(ValueError, match="exactly one other field"):
        build_model(cfg, no_target)
    two_lengths = unroll_spec(FeatureSpec((), (
        FieldSpec("i", 3), FieldSpec("c", 3), FieldSpec("h", 3, max_len=2, table="i"),
        FieldSpec("hc", 3, max_len=3, table="c"))))
    with pytest.raises(ValueError, match="different lengths"):
        build_model(cfg, two_lengths)
    with pytest.raises(ValueError, match="din_pooling"):
        ModelConfig(name="din", din_pooling="max")
