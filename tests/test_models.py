"""Models against the hand-written numpy reference (tests/reference_models.py), and the ops.

Every model, with and without dense features, on a tiny batch (B=5, F=4, D=3, n_dense=2):
forward logits, gradients w.r.t. (params, acts), and one SGD step agree with float64 numpy.
Parameters are drawn at random rather than taken from the init, so that zero-initialised biases
and linear weights take part in the check.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recjax.features import FeatureSpec, FieldSpec
from recjax.models import MODELS, ModelConfig, bce_loss, build_model, dummy_inputs, embedding_groups
from recjax.models.config import MODEL_NAMES
from recjax.models.ops import (
    MLP,
    cross_layer,
    dense_dot_general,
    dot_interaction,
    first_order,
    fm_second_order,
    interaction_pairs,
)
from tests.reference_models import bce, reference

B, F, D = 5, 4, 3
SGD_LR = 0.1
# Tolerances for float32 JAX against float64 numpy (STYLE rule 6); never loosened to pass.
RTOL, ATOL = 1e-5, 1e-6

SMALL = dict(embed_dim=D, bottom_mlp=(6, 4), top_mlp=(5, 4), deep_mlp=(6, 5), cross_layers=2)
CASES = {f"{name}-dense{n}": (ModelConfig(name=name, **SMALL), n)
         for name, n in itertools.product(MODEL_NAMES, (2, 0))}
CASES.update({
    "dlrm-self-dense2": (ModelConfig(name="dlrm", interaction_self=True, **SMALL), 2),
    "dlrm-self-dense0": (ModelConfig(name="dlrm", interaction_self=True, **SMALL), 0),
    "dcn-nodeep-dense2": (ModelConfig(name="dcn", **{**SMALL, "deep_mlp": ()}), 2),
    "dcn-nocross-dense2": (ModelConfig(name="dcn", **{**SMALL, "cross_layers": 0}), 2),
    "deepfm-linear-dense2": (ModelConfig(name="deepfm", **{**SMALL, "deep_mlp": ()}), 2),
    "dlrm-linear-dense2": (ModelConfig(name="dlrm", **{**SMALL, "bottom_mlp": (),
                                                      "top_mlp": ()}), 2),
})


def make_spec(n_dense: int, n_fields: int = F) -> FeatureSpec:
    return FeatureSpec(tuple(f"I{i}" for i in range(n_dense)),
                       tuple(FieldSpec(f"C{i}", 10) for i in range(n_fields)))


def setup(cfg: ModelConfig, n_dense: int, seed: int = 0):
    """Model, random float32 params, acts, dense and labels for a tiny batch.

    Every parameter is drawn at random (kernels scaled by 1/sqrt(fan_in) to keep activations
    O(1)) rather than taken from the init, so that zero-initialised biases and linear weights
    take part in the check; `jax.eval_shape` gives the tree without compiling the init.
    """
    spec = make_spec(n_dense)
    model = build_model(cfg, spec)
    rng = np.random.default_rng(seed)
    acts = {g: jnp.asarray(rng.normal(size=(B, F, d)), jnp.float32)
            for g, d in embedding_groups(cfg).items()}
    dense = jnp.asarray(rng.normal(size=(B, n_dense)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 2, size=B), jnp.float32)
    shapes = jax.eval_shape(model.init, jax.random.key(seed), acts, dense)["params"]
    params = jax.tree.map(
        lambda s: jnp.asarray(rng.normal(size=s.shape) * (max(s.shape[0], 1) ** -0.5
                                                          if len(s.shape) == 2 else 0.3),
                              jnp.float32), shapes)
    return model, params, acts, dense, labels


def loss_fn(model):
    def f(params, acts, dense, labels):
        return bce_loss(model.apply({"params": params}, acts, dense), labels)
    return f


@functools.cache
def run_case(case: str) -> dict:
    """Everything the per-model tests compare, computed once per case by one jitted function.

    One compilation per case (instead of op-by-op execution) keeps the file well under 30 s.
    """
    cfg, n_dense = CASES[case]
    model, params, acts, dense, labels = setup(cfg, n_dense)
    loss = loss_fn(model)

    @jax.jit
    def compute(params, acts, dense, labels):
        logits = model.apply({"params": params}, acts, dense)
        value, (g_params, g_acts) = jax.value_and_grad(loss, argnums=(0, 1))(
            params, acts, dense, labels)
        new_params = jax.tree.map(lambda p, g: p - SGD_LR * g, params, g_params)  # one SGD step
        return dict(logits=logits, loss=value, g_params=g_params, g_acts=g_acts,
                    new_params=new_params, loss_after=loss(new_params, acts, dense, labels))

    out = compute(params, acts, dense, labels)
    return dict(cfg=cfg, params=params, acts=acts, dense=dense, labels=labels, **out)


def ref(r: dict, params=None):
    """The numpy reference at the case's inputs (and at ``params`` if given)."""
    return reference(r["cfg"].name, r["params"] if params is None else params, r["acts"],
                     r["dense"], r["labels"], interaction_self=r["cfg"].interaction_self)


def assert_tree_close(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for path, a in jax.tree_util.tree_leaves_with_path(actual):
        e = expected
        for key in path:
            e = e[key.key]
        np.testing.assert_allclose(np.asarray(a), e, rtol=RTOL, atol=ATOL,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_numpy(case):
    r = run_case(case)
    _, ref_logits, _, _ = ref(r)
    np.testing.assert_allclose(np.asarray(r["logits"]), ref_logits, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES)
def test_grads_match_numpy(case):
    r = run_case(case)
    ref_loss, _, ref_g_params, ref_g_acts = ref(r)
    np.testing.assert_allclose(float(r["loss"]), ref_loss, rtol=RTOL, atol=ATOL)
    assert_tree_close(r["g_params"], ref_g_params)
    assert_tree_close(r["g_acts"], ref_g_acts)


@pytest.mark.parametrize("case", CASES)
def test_sgd_step_matches_numpy(case):
    r = run_case(case)
    ref_loss, _, ref_g, _ = ref(r)
    ref_new = jax.tree.map(lambda p, g: np.asarray(p, np.float64) - SGD_LR * g, r["params"], ref_g)
    assert_tree_close(r["new_params"], ref_new)
    # The step went somewhere: the loss after it agrees too, and it went down.
    np.testing.assert_allclose(float(r["loss_after"]), ref(r, ref_new)[0], rtol=RTOL, atol=ATOL)
    assert float(r["loss_after"]) < ref_loss


def test_reference_accepts_whole_variables():
    """`reference` takes ``variables["params"]`` or ``{"params": ...}`` and answers in kind."""
    r = run_case("dlrm-dense2")
    inner = ref(r)
    outer = reference("dlrm", {"params": r["params"]}, r["acts"], r["dense"], r["labels"])
    assert set(outer[2]) == {"params"}
    assert_tree_close(outer[2]["params"], inner[2])


@pytest.mark.parametrize("n_dense", [2, 0])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_output_shape_and_jit(name, n_dense):
    """The model traces and compiles under jit (run_case) and returns logits f32[B]."""
    logits = run_case(f"{name}-dense{n_dense}")["logits"]
    assert logits.shape == (B,) and logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))


def test_kaggle_default_shapes():
    """Default config = DLRM Kaggle: bottom 13-512-256-64-16, top 367-512-256-1."""
    cfg, spec = ModelConfig(), make_spec(13, 26)
    model = build_model(cfg, spec)
    shapes = jax.eval_shape(model.init, jax.random.key(0), *dummy_inputs(cfg, spec, 2))
    p = shapes["params"]
    assert [p["bottom"][f"layer_{i}"]["kernel"].shape for i in range(4)] == [
        (13, 512), (512, 256), (256, 64), (64, 16)]
    assert [p["top"][f"layer_{i}"]["kernel"].shape for i in range(3)] == [
        (367, 512), (512, 256), (256, 1)]
    assert cfg.bottom_layers == (512, 256, 64, 16)


def test_param_trees():
    for n_dense in (2, 0):
        spec = make_spec(n_dense)
        for name in MODEL_NAMES:
            cfg = ModelConfig(name=name, **SMALL)
            params = jax.eval_shape(build_model(cfg, spec).init, jax.random.key(0),
                                    *dummy_inputs(cfg, spec))["params"]
            assert ("dense_w" in params) == (n_dense > 0 and name in ("lr", "fm", "wide_deep",
                                                                      "deepfm"))
            assert ("bottom" in params) == (n_dense > 0 and name == "dlrm")
    cfg = ModelConfig(name="dcn", **SMALL)
    spec = make_spec(2)
    params = jax.jit(build_model(cfg, spec).init)(
        jax.random.key(0), *dummy_inputs(cfg, spec))["params"]
    assert params["cross_w"].shape == (2, F * D + 2)
    assert np.all(np.asarray(params["cross_w"]) != 0), "cross w_l must start random, not zero"


def test_embedding_groups():
    assert embedding_groups(ModelConfig(name="lr")) == {"wide": 1}
    for name in ("fm", "wide_deep", "deepfm"):
        assert embedding_groups(ModelConfig(name=name, embed_dim=7)) == {"wide": 1, "emb": 7}
    for name in ("dlrm", "dcn"):
        assert embedding_groups(ModelConfig(name=name, embed_dim=7)) == {"emb": 7}
    assert set(MODELS) == set(MODEL_NAMES)


def test_config_checks():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        ModelConfig(name="nope")
    with pytest.raises(ValueError, match="embed_dim"):
        ModelConfig(embed_dim=0)
    with pytest.raises(ValueError, match="top_mlp"):
        ModelConfig(top_mlp=(8, 0))
    with pytest.raises(ValueError, match="cross_layers"):
        ModelConfig(cross_layers=-1)
    assert ModelConfig(deep_mlp=[8, 4]).deep_mlp == (8, 4)  # CLI/JSON lists become tuples
    with pytest.raises(ValueError, match="no pairs"):
        build_model(ModelConfig(name="dlrm"), make_spec(0, n_fields=1))


def test_shape_errors_are_readable():
    cfg = ModelConfig(name="deepfm", **SMALL)
    model, params, acts, dense, _ = setup(cfg, 2)
    with pytest.raises(ValueError, match=r"'emb' has shape \(5, 4, 2\), expected \(5, 4, 3\)"):
        model.apply({"params": params}, {**acts, "emb": acts["emb"][..., :2]}, dense)
    with pytest.raises(ValueError, match="needs activation group 'wide'"):
        model.apply({"params": params}, {"emb": acts["emb"]}, dense)
    with pytest.raises(ValueError, match=r"dense features have shape \(5, 3\)"):
        model.apply({"params": params}, acts, jnp.zeros((B, 3)))


# ---- loss ----------------------------------------------------------------------------------


def test_bce_loss_stable_and_matches():
    logits = jnp.array([-100.0, -3.0, 0.0, 2.5, 100.0, 100.0], jnp.float32)
    labels = jnp.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0], jnp.float32)
    loss, grad = jax.value_and_grad(bce_loss)(logits, labels)
    ref_loss, ref_grad = bce(np.asarray(logits, np.float64), np.asarray(labels, np.float64))
    np.testing.assert_allclose(float(loss), ref_loss, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=RTOL, atol=1e-8)
    # Per example softplus(x) - x y, written out; the confident miss (x=100, y=0) costs 100,
    # and nothing overflows. Gradient at x = 0 is sigmoid(0) - y = -0.5 (see bce_loss).
    per = [0.0, np.log1p(np.exp(3.0)), np.log(2.0), np.log1p(np.exp(2.5)), 0.0, 100.0]
    np.testing.assert_allclose(float(loss), np.mean(per), rtol=RTOL)


# ---- ops -----------------------------------------------------------------------------------


@pytest.mark.parametrize("self_pairs", [False, True])
def test_dot_interaction_against_loop(self_pairs):
    v = np.random.default_rng(0).normal(size=(B, 5, D)).astype(np.float32)
    expected = np.array([[v[b, i] @ v[b, j] for i in range(5) for j in range(5)
                          if j > i or (self_pairs and j == i)] for b in range(B)])
    out = dot_interaction(jnp.asarray(v), self_pairs)
    assert out.shape == (B, 15 if self_pairs else 10)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=RTOL, atol=ATOL)
    assert len(interaction_pairs(27)[0]) == 351  # the DLRM Kaggle count


def test_fm_second_order_against_pairwise():
    v = np.random.default_rng(1).normal(size=(B, F, D))
    expected = sum(np.sum(v[:, i] * v[:, j], axis=-1)
                   for i in range(F) for j in range(i + 1, F))
    out = fm_second_order(jnp.asarray(v, jnp.float32))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=RTOL, atol=ATOL)


def test_first_order_sums_fields():
    w = np.random.default_rng(2).normal(size=(B, F, 1))
    np.testing.assert_allclose(np.asarray(first_order(jnp.asarray(w, jnp.float32))),
                               w[:, :, 0].sum(1), rtol=RTOL, atol=ATOL)


def test_cross_layer_against_formula():
    rng = np.random.default_rng(3)
    x0, x = rng.normal(size=(2, B, 7))
    w, b = rng.normal(size=(2, 7))
    # Eq. 3 literally: the outer product x0 x^T (a K x K matrix per example) times w.
    expected = np.einsum("bi,bj,j->bi", x0, x, w) + b + x
    out = cross_layer(*(jnp.asarray(a, jnp.float32) for a in (x0, x, w, b)))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=RTOL, atol=ATOL)


def test_mlp_last_linear():
    x = jnp.asarray(np.random.default_rng(4).normal(size=(64, 3)), jnp.float32)
    for last_linear in (True, False):
        mlp = MLP((4, 2), last_linear=last_linear)
        params = mlp.init(jax.random.key(0), x)
        assert set(params["params"]) == {"layer_0", "layer_1"}
        y = jax.jit(mlp.apply)(params, x)
        assert bool(jnp.any(y < 0)) == last_linear


@pytest.mark.parametrize("self_pairs", [False, True])
def test_dot_interaction_gradient_against_autodiff(self_pairs):
    """The hand-written VJP (dV^T = V^T S from the materialized transpose) equals autodiff of
    the plain triu-gather form."""
    rng = np.random.default_rng(5)
    v = jnp.asarray(rng.normal(size=(B, 6, D)), jnp.float32)
    i, j = interaction_pairs(6, self_pairs)
    w = jnp.asarray(rng.normal(size=(len(i),)), jnp.float32)
    plain = lambda v: jnp.einsum("bnd,bmd->bnm", v, v)[:, i, j]  # noqa: E731
    got = jax.grad(lambda v: jnp.sum(dot_interaction(v, self_pairs) * w))(v)
    want = jax.grad(lambda v: jnp.sum(plain(v) * w))(v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n_in,n_out", [(7, 3), (3, 7), (5, 5)])  # halving, widening, square
def test_dense_dot_general_matches_plain_matmul(n_in, n_out):
    """Both weight-gradient orientations of `dense_dot_general` give x^T g and g w^T."""
    rng = np.random.default_rng(6)
    x, w, g = (jnp.asarray(rng.normal(size=s), jnp.float32)
               for s in ((9, n_in), (n_in, n_out), (9, n_out)))
    dn = (((1,), (0,)), ((), ()))
    out, vjp = jax.vjp(lambda x, w: dense_dot_general(x, w, dn), x, w)
    dx, dw = vjp(g)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x) @ np.asarray(w), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(g) @ np.asarray(w).T, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(x).T @ np.asarray(g), rtol=RTOL, atol=ATOL)
    # a 3-D input is not the plain case: it goes to lax.dot_general unchanged
    x3 = jnp.asarray(rng.normal(size=(2, 4, n_in)), jnp.float32)
    np.testing.assert_allclose(np.asarray(dense_dot_general(x3, w, (((2,), (0,)), ((), ())))),
                               np.einsum("abi,io->abo", x3, w), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n_in,n_out", [(7, 3), (3, 7)])
def test_dense_dot_general_sums_replicated_weight_gradient_in_shard_map(n_in, n_out):
    """Inside shard_map, a replicated weight's gradient is the sum over the devices' batch
    shards, as autodiff of a plain matmul gives (8 fake CPU devices)."""
    mesh = jax.make_mesh((8,), ("d",))
    spec = jax.sharding.PartitionSpec
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=(16, n_in)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(n_in, n_out)), jnp.float32)
    dn = (((1,), (0,)), ((), ()))

    def grads(dot):
        f = lambda w, x: jax.grad(lambda w: jnp.sum(jnp.sin(dot(x, w, dn))))(w)  # noqa: E731
        sharded = jax.shard_map(f, mesh=mesh, in_specs=(spec(), spec("d")), out_specs=spec())
        return jax.jit(sharded)(w, jax.device_put(x, jax.NamedSharding(mesh, spec("d"))))

    np.testing.assert_allclose(np.asarray(grads(dense_dot_general)),
                               np.asarray(grads(jax.lax.dot_general)), rtol=RTOL, atol=ATOL)
    single = jax.grad(lambda w: jnp.sum(jnp.sin(x @ w)))(w)
    np.testing.assert_allclose(np.asarray(grads(dense_dot_general)), np.asarray(single),
                               rtol=1e-5, atol=1e-5)
