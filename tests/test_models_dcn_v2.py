"""DCN-v2 (recjax/models/dcn_v2.py) against a float64 numpy reference written from the paper's
equations (Wang et al. 2021, Eq. 1, 4-5; Sec. 3 structures), on the module's own parameters;
and the model trained by every algorithm that can (DES refuses it with the reason)."""


import jax
import numpy as np
import pytest

from recjax.features import FeatureSpec, FieldSpec
from recjax.models import ModelConfig, build_model, dummy_inputs
from recjax.models.config import MODEL_NAMES

SPEC = FeatureSpec(dense_names=("a", "b", "c"), fields=tuple(FieldSpec(f"C{i}", 50) for i in range(4)))


def _relu(x):
    return np.maximum(x, 0.0)


def _reference(p: dict, emb: np.ndarray, dense: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Logits in float64, one example at a time, layer by layer as the paper writes them."""
    f64 = {k: np.asarray(v, np.float64) for k, v in jax.tree_util.tree_leaves_with_path(p)
           for k in [jax.tree_util.keystr(k)]}

    def get(name):
        return f64.get(f"['{name}']")

    out = []
    for e, d in zip(emb.astype(np.float64), dense.astype(np.float64)):
        x0 = np.concatenate([e.reshape(-1), d])
        x = x0.copy()
        for layer in range(cfg.cross_layers):
            b = get("cross_b")[layer]
            if cfg.cross_rank == 0:  # Eq. 1
                x = x0 * (get("cross_w")[layer] @ x + b) + x
            elif cfg.cross_experts == 1:  # W = U V^T
                u, v = get("cross_u")[layer, 0], get("cross_v")[layer, 0]
                x = x0 * (u @ (v.T @ x) + b) + x
            else:  # Eq. 4-5
                experts, logits = [], []
                for i in range(cfg.cross_experts):
                    u, v = get("cross_u")[layer, i], get("cross_v")[layer, i]
                    c = get("cross_c")[layer, i]
                    experts.append(x0 * (u @ _relu(c @ _relu(v.T @ x)) + b))
                    logits.append(get("cross_gate")[layer, i] @ x)
                gate = np.exp(np.array(logits) - max(logits))
                gate /= gate.sum()
                x = sum(g * ex for g, ex in zip(gate, experts)) + x
        h = x0 if cfg.cross_structure == "parallel" else x
        for j in range(len(cfg.deep_mlp)):
            h = _relu(h @ f64[f"['deep']['layer_{j}']['kernel']"] + f64[f"['deep']['layer_{j}']['bias']"])
        top = np.concatenate([x, h]) if cfg.cross_structure == "parallel" else h
        if not cfg.deep_mlp:
            top = x
        out.append(top @ f64["['out']['kernel']"][:, 0] + f64["['out']['bias']"][0])
    return np.array(out)


@pytest.mark.parametrize("rank,experts,structure,deep", [
    (0, 1, "stacked", (16, 8)), (0, 1, "parallel", (16, 8)), (3, 1, "stacked", (16,)),
    (3, 1, "parallel", (16,)), (2, 3, "stacked", (16, 8)), (2, 3, "parallel", ()),
])
def test_forward_matches_the_papers_equations(rank, experts, structure, deep):
    cfg = ModelConfig(name="dcn_v2", embed_dim=4, deep_mlp=deep, cross_layers=2, cross_rank=rank,
                      cross_experts=experts, cross_structure=structure)
    model = build_model(cfg, SPEC)
    acts, dense = dummy_inputs(cfg, SPEC, batch_size=5)
    rng = np.random.default_rng(0)
    emb = rng.normal(size=acts["emb"].shape).astype(np.float32)
    dense = rng.normal(size=dense.shape).astype(np.float32)
    params = model.init(jax.random.PRNGKey(1), {"emb": emb}, dense)["params"]
    # the biases start at 0: give them values, or a wrong bias term would go unseen
    params = jax.tree_util.tree_map_with_path(
        lambda k, v: v + 0.1 * rng.normal(size=v.shape).astype(np.float32)
        if "bias" in jax.tree_util.keystr(k) or "cross_b" in jax.tree_util.keystr(k) else v, params)
    got = np.asarray(model.apply({"params": params}, {"emb": emb}, dense))
    want = _reference(params, emb, dense, cfg)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    k = 4 * 4 + 3
    shapes = {kk: v.shape for kk, v in params.items() if kk.startswith("cross")}
    if rank == 0:
        assert shapes["cross_w"] == (2, k, k)
    else:
        assert shapes["cross_u"] == shapes["cross_v"] == (2, experts, k, rank)
        assert ("cross_c" in shapes) == ("cross_gate" in shapes) == (experts > 1)


def test_initial_cross_matrices_have_glorot_scale():
    cfg = ModelConfig(name="dcn_v2", embed_dim=8, deep_mlp=(), cross_layers=4, cross_rank=0)
    spec = FeatureSpec(dense_names=(), fields=tuple(FieldSpec(f"C{i}", 10) for i in range(32)))
    model = build_model(cfg, spec)
    acts, dense = dummy_inputs(cfg, spec)
    w = np.asarray(model.init(jax.random.PRNGKey(0), acts, dense)["params"]["cross_w"])
    k = 256  # each layer's W is one K x K matrix: std sqrt(2 / (K + K))
    assert w.std() == pytest.approx((2 / (2 * k)) ** 0.5, rel=0.05)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="needs model.cross_rank > 0"):
        ModelConfig(name="dcn_v2", cross_experts=2)
    with pytest.raises(ValueError, match="cross_structure"):
        ModelConfig(name="dcn_v2", cross_structure="side_by_side")
    assert "dcn_v2" in MODEL_NAMES


@pytest.mark.parametrize("rank,structure,deep", [
    (0, "parallel", (6, 4)), (3, "stacked", (6, 4)), (3, "parallel", (6,)), (2, "stacked", ()),
])
def test_gradients_match_the_hand_written_backward(rank, structure, deep):
    from recjax.models import bce_loss
    from tests.reference_models import reference

    cfg = ModelConfig(name="dcn_v2", embed_dim=3, deep_mlp=deep, cross_layers=2, cross_rank=rank,
                      cross_structure=structure)
    model = build_model(cfg, SPEC)
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(6, 4, 3)).astype(np.float32)
    dense = rng.normal(size=(6, 3)).astype(np.float32)
    label = (rng.random(6) < 0.5).astype(np.float32)
    params = model.init(jax.random.PRNGKey(2), {"emb": emb}, dense)["params"]

    def loss(p, e):
        return bce_loss(model.apply({"params": p}, {"emb": e}, dense), label)

    g_params, g_emb = jax.grad(loss, argnums=(0, 1))(params, emb)
    want_loss, _, want_params, want_acts = reference("dcn_v2", params, {"emb": emb}, dense, label)
    assert float(loss(params, emb)) == pytest.approx(want_loss, rel=1e-5)
    flat = dict(jax.tree_util.tree_leaves_with_path(want_params))
    for path, got in jax.tree_util.tree_leaves_with_path(g_params):
        np.testing.assert_allclose(got, flat[path], rtol=1e-4, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
    np.testing.assert_allclose(g_emb, want_acts["emb"], rtol=1e-4, atol=1e-6)
