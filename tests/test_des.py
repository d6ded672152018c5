"""DES == the unsplit operators and the single-device step (8 fake CPU devices, conftest.py).

* every substitution (LR Eq. 2-3, FM Eq. 4-6, first FC Eq. 7-9, DCN cross), through each model
  that uses it, with random params and activations and random, uneven field -> shard
  assignments (empty shards included): logits AND gradients w.r.t. params and activations;
* the slot lookup on rank-coded tables returns exactly the reference activations;
* whole training steps (Adam dense, Adagrad sparse) on field-only and data x field meshes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from algorithms.des import IDS, DesSetup, DesStrategy
from recjax.embeddings import lookup
from recjax.train.step import resolve_microbatches
from sharding import des
from sharding.mesh import make_mesh
from sharding.spmd import batch_specs
from tests.test_sharding_helpers import (
    MULTI_HOT,
    ONE_HOT,
    assert_states_close,
    build_spec,
    random_batch,
    rank_coded,
    reference_steps,
    tiny_cfg,
)

MODELS = list(des.SUBSTITUTIONS)


def _placement(seed: int, n: int) -> str:
    """A random, uneven assignment keeping fields a and c (table "ac") together."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, n, ONE_HOT.n_fields)
    s[2] = s[0]
    return ",".join(map(str, s))


@pytest.mark.parametrize("seed,b", [(0, 8), (2, 6), pytest.param(1, 8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("model_name", MODELS)
def test_substitution_forward_and_grads(model_name, seed, b):
    """b = 8 splits over the 4 field shards (reduce-scatter, upper layers on b / 4 rows each);
    b = 6 does not (all-reduce, every shard the whole batch)."""
    n = 4
    placement = _placement(seed, n)
    cfg = tiny_cfg(model_name, placement=placement)
    model, _, _, state = build_spec(cfg, ONE_HOT)
    setup = DesSetup.from_config(cfg, n, ONE_HOT)
    dl = setup.layout
    rng = np.random.default_rng(seed + 10)
    params = jax.tree.map(lambda x: 0.5 * rng.normal(size=x.shape).astype(np.float32), state.params)
    acts = {g: rng.normal(size=(b, ONE_HOT.n_fields, d)).astype(np.float32) for g, d in
            model.layout.groups}
    dense = rng.normal(size=(b, ONE_HOT.n_dense)).astype(np.float32)
    c = rng.normal(size=b).astype(np.float32)  # loss = c . logits: every logit's gradient

    def ref_loss(p, a):
        logits = model.logits(p, a, dense)
        return jnp.dot(c, logits), logits

    (_, want), (gp_want, ga_want) = jax.value_and_grad(ref_loss, (0, 1), has_aux=True)(params, acts)

    slot = np.asarray(dl.slot_field)
    slot_acts = {g: np.where((slot >= 0)[None, :, None], a[:, np.maximum(slot, 0), :], 0.0)
                 for g, a in acts.items()}
    dparams = des.split_params(dl, model_name, params)
    fwd = des.DesForward(model_name)

    def body(p, a, x):
        def loss(p, a):
            logits = fwd.logits(p, a, x)
            return jnp.dot(c, logits), logits
        (_, logits), (gp, ga) = jax.value_and_grad(loss, (0, 1), has_aux=True)(p, a)
        return logits, gp, ga

    pspec = des.param_specs(model_name, dparams)
    aspec = {g: P(None, "field") for g in slot_acts}
    got, gp, ga = jax.jit(jax.shard_map(body, mesh=make_mesh({"data": 1, "field": n}),
                                        in_specs=(pspec, aspec, P()),
                                        out_specs=(P(), pspec, aspec)))(dparams, slot_acts, dense)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    joined = des.join_params(dl, model_name, jax.tree.map(np.asarray, gp))
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(gp_want)[0], jax.tree.leaves(joined)):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))
    where = {f: i for i, f in enumerate(slot) if f >= 0}
    for g in ga_want:
        back = np.asarray(ga[g])[:, [where[f] for f in range(ONE_HOT.n_fields)], :]
        np.testing.assert_allclose(back, ga_want[g], rtol=1e-4, atol=1e-5, err_msg=g)


@pytest.mark.parametrize("placement", ["round_robin", "balanced", "3,0,3,3"])
def test_slot_lookup_rank_coded_exact(placement):
    cfg = tiny_cfg("deepfm", placement=placement)
    model, tx, sopt, state = build_spec(cfg, MULTI_HOT)
    state = rank_coded(state)
    strat = DesStrategy(DesSetup.from_config(cfg, 4, MULTI_HOT), model, tx, sopt)
    placed = strat.prepare(state)
    batch = random_batch(MULTI_HOT, 8, seed=2)
    want = lookup(model.layout, state.tables, batch.ids, batch.mask)
    dl = strat.dl
    got = jax.jit(jax.shard_map(lambda t, b: lookup(dl.local, t, b.ids, b.mask), mesh=strat.mesh,
                                in_specs=(strat.specs.tables, batch_specs(True, IDS)),
                                out_specs=P("data", "field")))(placed.tables, strat.put_batch(batch))
    slot = np.asarray(dl.slot_field)
    for g in want:
        got_g = np.asarray(got[g])
        np.testing.assert_array_equal(got_g[:, slot >= 0], np.asarray(want[g])[:, slot[slot >= 0]])
        assert not got_g[:, slot < 0].any()  # padding slots are exactly zero


@functools.lru_cache(maxsize=8)
def _reference(model_name: str, multi_hot: bool):
    spec = MULTI_HOT if multi_hot else ONE_HOT
    cfg = tiny_cfg(model_name, pooling="mean" if multi_hot else "sum")
    model, tx, sopt, state = build_spec(cfg, spec)
    state = jax.tree.map(np.asarray, state)
    batches = [random_batch(spec, 16, seed=s) for s in (0, 1)]
    return (model, tx, sopt, state, batches) + reference_steps(model, tx, sopt, state, batches)


@pytest.mark.parametrize("model_name,mesh,multi_hot", [
    ("deepfm", "", False), ("dcn", "data=2,field=4", False), ("fm", "data=4,field=2", True),
    pytest.param("lr", "", True, marks=pytest.mark.slow),
    pytest.param("wide_deep", "data=2,field=4", False, marks=pytest.mark.slow)])
def test_two_steps_match_single_device(model_name, mesh, multi_hot):
    spec = MULTI_HOT if multi_hot else ONE_HOT
    n_field = 8 // int(mesh.split(",")[0].split("=")[1]) if mesh else 8
    placement = "1,0,1,1" if multi_hot else _placement(5, n_field)
    cfg = tiny_cfg(model_name, mesh=mesh, placement=placement,
                   pooling="mean" if multi_hot else "sum")
    model, tx, sopt, state, batches, ref, ref_m = _reference(model_name, multi_hot)
    strat = DesStrategy(DesSetup.from_config(cfg, 8, spec), model, tx, sopt)
    s = strat.prepare(state)
    for b, rm in zip(batches, ref_m):
        s, m = strat.train_step(s, strat.put_batch(b))
        np.testing.assert_allclose(float(m.loss), float(rm.loss), rtol=1e-5)
    assert_states_close(ref, strat.unshard(s), rtol=1e-4, atol=1e-6)
    summary = strat.summary()
    assert summary["comm_bytes_per_step"] > 0 and summary["comm_baseline_bytes_per_step"] > 0


def test_placements():
    assert des.place_fields(ONE_HOT, 3, "round_robin") == (0, 1, 0, 2, 0)  # tables ac,b,e,f
    bal = des.place_fields(ONE_HOT, 2, "balanced")
    assert bal[0] == bal[2] and len(set(bal)) == 2
    with pytest.raises(ValueError, match="must be co-located"):
        des.place_fields(ONE_HOT, 2, "0,1,1,0,0")
    with pytest.raises(ValueError, match="needs 5 shard numbers"):
        des.place_fields(ONE_HOT, 2, "0,1")
    with pytest.raises(ValueError, match="round_robin, balanced"):
        des.place_fields(ONE_HOT, 2, "mod")


@pytest.mark.parametrize("model_name", ["dcn", "deepfm"])
def test_microbatched_step(model_name):
    """train.microbatches=2 under DES == the reference, and no more all-reduce traffic over
    `data` than one pass: the replicated params' gradient is summed over the batch shards once
    per step, not once per slice (it was 2x at 2 slices). The collectives over `field` are per
    slice by nature: they are the substituted operators' forward and backward."""
    import dataclasses

    cfg = tiny_cfg(model_name, mesh="data=2,field=4", placement=_placement(3, 4))
    model, tx, sopt, state, batches, ref, _ = _reference(model_name, False)
    strats = [DesStrategy(DesSetup.from_config(cfg, 8, ONE_HOT),
                          dataclasses.replace(model, microbatches=m), tx, sopt) for m in (1, 2)]
    strats[0].prepare(state)  # builds its step, whose collectives are compared below
    s = strats[1].prepare(state)
    for b in batches:
        s, _ = strats[1].train_step(s, strats[1].put_batch(b))
    assert_states_close(ref, strats[1].unshard(s), rtol=1e-4, atol=1e-6)
    over_data = lambda st: sum(  # noqa: E731
        r["bytes"] for r in st.summary()["comm_collectives"]
        if r["op"] == "all_reduce" and "data" in r["axes"])
    assert 0 < over_data(strats[1]) <= over_data(strats[0])


def test_auto_microbatches_is_one_pass():
    """Auto slicing under DES is one pass: each slice would repeat the forward's collectives
    over `field` (8 slices: 32 collectives a step instead of 4; on 8 fake devices 0.70 instead
    of 0.84 of the one-pass single device, docs/performance.md). At 1024 rows the single-device
    auto cuts 2 slices; DES's auto step must move exactly what its one-pass step moves."""
    import dataclasses

    cfg = tiny_cfg("deepfm", batch=1024, placement=_placement(5, 8))
    model, tx, sopt, state = build_spec(cfg, ONE_HOT)
    assert resolve_microbatches(model.microbatches, 1024, "cpu") == 2
    comm = []
    for m in (0, 1):
        strat = DesStrategy(DesSetup.from_config(cfg, 8, ONE_HOT),
                            dataclasses.replace(model, microbatches=m), tx, sopt)
        strat.prepare(jax.tree.map(np.asarray, state))
        comm.append(strat.summary()["comm_collectives"])
    assert comm[0] == comm[1]
