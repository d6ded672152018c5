"""The plain-JAX references of recjax/tools/bench_models_seq.py compute the recjax models they
are timed against (same loss on the same parameters and rows), so its ratios compare like with
like."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recjax.data.synthetic_seq import SeqTeacherConfig, SeqTeacherSource
from recjax.features import FeatureSpec, FieldSpec
from recjax.models import ModelConfig, bce_loss, build_model
from recjax.tools import bench_models_seq as bm


def _mlp(tree, n):
    return [(tree[f"layer_{i}"]["kernel"], tree[f"layer_{i}"]["bias"]) for i in range(n)]


@pytest.mark.parametrize("name", ["dcn_v2", "din", "bst"])
def test_reference_is_the_recjax_model(name):
    rng = np.random.default_rng(0)
    if name == "bst":
        spec = SeqTeacherSource(SeqTeacherConfig(n=10, max_len=4, n_items=20)).spec
        cfg = ModelConfig(name="bst", embed_dim=4, bst_heads=2, bst_pos_dim=2, deep_mlp=(6, 3))
        _, loss, _ = bm.bst_reference(spec, 4, 2, 2, (6, 3), rng)
    elif name == "din":
        spec = SeqTeacherSource(SeqTeacherConfig(n=10, max_len=4, n_items=20)).spec
        cfg = ModelConfig(name="din", embed_dim=4, att_mlp=(5,), deep_mlp=(6, 3))
        _, loss, _ = bm.din_reference(spec, 4, 5, (6, 3), rng)
    else:
        spec = FeatureSpec(("a", "b"), tuple(FieldSpec(f"C{i}", 9) for i in range(3)))
        cfg = ModelConfig(name="dcn_v2", embed_dim=4, deep_mlp=(6, 3), cross_layers=2)
        _, loss, _ = bm.dcn_v2_reference(spec, 4, 2, (6, 3), rng)
    model = build_model(cfg, spec)
    emb = jnp.asarray(rng.normal(size=(5, spec.n_fields, 4)), jnp.float32)
    if name == "bst":  # padding: example 0 has one behaviour, example 1 none
        emb = emb.at[0, 4:7].set(0).at[0, 8:].set(0).at[1, 3:7].set(0).at[1, 7:].set(0)
    dense = jnp.asarray(rng.normal(size=(5, spec.n_dense)), jnp.float32)
    label = jnp.asarray([0, 1, 1, 0, 1], jnp.float32)
    shapes = jax.eval_shape(model.init, jax.random.key(0), {"emb": emb}, dense)["params"]
    p = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.4, jnp.float32), shapes)
    want = float(bce_loss(model.apply({"params": p}, {"emb": emb}, dense), label))
    if name == "bst":
        ref = {"pos": p["pos"], "block": p["block_0"], "deep": _mlp(p["deep"], 2),
               "out": [(p["out"]["kernel"], p["out"]["bias"])]}
    elif name == "din":
        ref = {"att": _mlp(p["att"], 2), "alpha": p["att"]["prelu_0"], "deep": _mlp(p["deep"], 2),
               "out": [(p["out"]["kernel"], p["out"]["bias"])]}
    else:
        ref = {"w": list(p["cross_w"]), "b": list(p["cross_b"]), "deep": _mlp(p["deep"], 2),
               "out": [(p["out"]["kernel"], p["out"]["bias"])]}
    assert float(loss(ref, emb, dense, label)) == pytest.approx(want, rel=1e-5)
