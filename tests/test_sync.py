"""Sync SPMD on 8 fake CPU devices == the single-device reference step (tests/conftest.py).

Every sharding type (data_parallel, table_wise, row_wise, column_wise), on a 2-D mesh (tables
on ``model``) and on the 1-D default (tables on ``data``, torchrec style), forward exactly on
rank-coded tables, and the trajectory over two steps (Adam dense, Adagrad sparse, which merges
duplicate ids, so a lost or double-counted row gradient fails).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.sync import SyncSetup, SyncStrategy
from recjax.embeddings import lookup
from sharding import embedding
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

KINDS = ["data_parallel", "table_wise", "row_wise", "column_wise"]
# "" = every device on data; data=2,model=4 runs with `make test-all` (slow)
MESHES = ["data=4,model=2", pytest.param("data=2,model=4", marks=pytest.mark.slow), ""]


@functools.lru_cache(maxsize=8)
def _reference(model_name: str, multi_hot: bool, pooling: str, sparse: str):
    """(model, tx, sopt, state, batches, reference state after them, reference metrics)."""
    spec = MULTI_HOT if multi_hot else ONE_HOT
    cfg = tiny_cfg(model_name, pooling=pooling, sparse=sparse)
    model, tx, sopt, state = build_spec(cfg, spec)
    state = jax.tree.map(np.asarray, state)
    batches = [random_batch(spec, 16, seed=s) for s in (0, 1)]
    ref, ref_m = reference_steps(model, tx, sopt, state, batches)
    return model, tx, sopt, state, batches, ref, ref_m


def _strategy(model, mesh, rules, spec=ONE_HOT, pooling="sum", sparse="adagrad", route=1.25):
    cfg = tiny_cfg(model, mesh=mesh, rules=rules, pooling=pooling, sparse=sparse,
                   route_capacity=route)
    setup = SyncSetup.from_config(cfg, 8, spec)
    m, tx, sopt, state, batches, ref, ref_m = _reference(model, spec is MULTI_HOT, pooling, sparse)
    return SyncStrategy(setup, m, tx, sopt), (m, tx, sopt), state, batches, ref, ref_m


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("kind", KINDS)
def test_lookup_rank_coded_exact(kind, mesh):
    """Each sharding type's lookup returns exactly the reference activations (multi-hot, sum)."""
    rules = f"emb/.*:{kind}" if kind == "column_wise" else f".*:{kind}"  # wide tables have D=1
    strat, (model, _, _), state, *_ = _strategy("deepfm", mesh, rules, MULTI_HOT, sparse="sgd")
    state = rank_coded(state)
    placed = strat.prepare(state)
    batch = random_batch(MULTI_HOT, 16, seed=3)
    want = lookup(model.layout, state.tables, batch.ids, batch.mask)
    plan, mesh_ = strat.plan, strat.mesh
    specs = strat.specs.tables
    from jax.sharding import PartitionSpec as P

    from sharding.spmd import batch_specs

    got = jax.jit(jax.shard_map(
        lambda t, b: embedding.sharded_lookup(plan, t, b.ids, b.mask), mesh=mesh_,
        in_specs=(specs, batch_specs(True)), out_specs=P("data")))(placed.tables,
                                                                  strat.put_batch(batch))
    for g in want:
        np.testing.assert_array_equal(np.asarray(got[g]), np.asarray(want[g]), err_msg=g)
    if not mesh:
        return
    # the training step's split lookup: each (data, model) device its own b / M rows, in order
    assert embedding.split_rows(plan, 16 // plan.n_batch)
    got = jax.jit(jax.shard_map(
        lambda t, b: embedding.sharded_lookup(plan, t, b.ids, b.mask, split=True), mesh=mesh_,
        in_specs=(specs, batch_specs(True)), out_specs=P(("data", plan.axis))))(
            placed.tables, strat.put_batch(batch))
    for g in want:
        np.testing.assert_array_equal(np.asarray(got[g]), np.asarray(want[g]), err_msg=g)


# Each type alone on the 1-D mesh; on the 2-D mesh all four at once run in
# test_mixed_rules_other_models (one type per 2-D run is slow-only, to keep `make test` short).
# data=1,model=8: a data axis of size 1, where the routed update's rows were typed as varying
# over data and lax.cond refused the step (table_wise, row_wise).
@pytest.mark.parametrize("mesh", [pytest.param("data=4,model=2", marks=pytest.mark.slow),
                                  pytest.param("data=1,model=8", marks=pytest.mark.slow), ""])
@pytest.mark.parametrize("kind", KINDS)
def test_two_steps_match_single_device(kind, mesh):
    rules = f"emb/.*:{kind}" if kind == "column_wise" else f".*:{kind}"  # wide tables have D=1
    # route=8: on the 1-D mesh the row stores always take the routed path (C = all entries)
    strat, (model, tx, sopt), state, batches, ref, ref_m = _strategy("deepfm", mesh, rules,
                                                                     route=8.0)
    s = strat.prepare(state)
    for b, rm in zip(batches, ref_m):
        s, m = strat.train_step(s, strat.put_batch(b))
        np.testing.assert_allclose(float(m.loss), float(rm.loss), rtol=1e-5)
        assert float(m.count) == 16
    assert_states_close(ref, strat.unshard(s), rtol=1e-4, atol=1e-6)
    if mesh:
        return
    logits = strat.predict(s.params, s.tables, random_batch(ONE_HOT, 13, seed=9))  # padded
    from recjax.train.step import predict
    ref_state = jax.tree.map(np.asarray, ref)
    want = predict(model, ref_state.params, ref_state.tables, random_batch(ONE_HOT, 13, seed=9))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", ["dlrm", pytest.param("dcn", marks=pytest.mark.slow),
                                   pytest.param("lr", marks=pytest.mark.slow)])
def test_mixed_rules_other_models(model):
    """A rule table mixing all four types (first match wins) on a 2-D mesh, multi-hot mean."""
    rules = "emb/ac:table_wise;emb/b:column_wise;emb/e:data_parallel;wide/b:table_wise;.*:row_wise"
    if model in ("dlrm", "dcn"):
        rules = "emb/ac:table_wise;emb/b:column_wise;emb/e:data_parallel;.*:row_wise"
    if model == "lr":
        rules = "wide/ac:table_wise;wide/b:data_parallel"
    strat, _, state, batches, ref, _ = _strategy(model, "data=4,model=2", rules, MULTI_HOT,
                                                 pooling="mean")
    s = strat.prepare(state)
    for b in batches:
        s, _ = strat.train_step(s, strat.put_batch(b))
    assert_states_close(ref, strat.unshard(s), rtol=1e-4, atol=1e-6)
    assert strat.summary()["comm_bytes_per_step"] > 0


MIXED_1D = "emb/ac:table_wise;emb/b:column_wise;emb/e:data_parallel;.*:row_wise"


@pytest.mark.parametrize("mesh", ["", "data=4,model=2"])
@pytest.mark.parametrize("factor,over", [(8.0, False), (0.01, True)])
def test_owner_routing(factor, over, mesh):
    """Every sharding type at once, multi-hot, on the 1-D mesh (tables on data) and the 2-D one
    (each device routes its own b / M rows over model): with room (C = all entries) the row
    stores take the routed path and their lookup is exact on rank-coded tables; with C = 1 the
    step takes the masked path. Both train like the reference (mean pooling, Adagrad)."""
    from jax.sharding import PartitionSpec as P

    from sharding import routing
    from sharding.spmd import batch_specs

    strat, (model, _, _), state, *_ = _strategy("deepfm", mesh, MIXED_1D, MULTI_HOT, sparse="sgd",
                                               route=factor)
    plan = strat.plan
    b = 16 // plan.n_batch
    assert routing.routable(plan, factor, b)
    rows = [s for s in plan.stores if s.kind == "rows"]
    assert {s.key for s in rows} == {"emb/@table_wise", "wide/@row_wise"}
    state = rank_coded(state)
    placed = strat.prepare(state)
    batch = random_batch(MULTI_HOT, 16, seed=3)
    split = not plan.same_axis
    mine = (lambda x: embedding.my_rows(plan, x)) if split else (lambda x: x)

    def routed(t, bt):
        w = embedding.pool_weights(plan, bt.ids, bt.mask)
        routes = {s.key: routing.make_route(plan, s, mine(bt.ids), mine(w), factor) for s in rows}
        got = {s.key: routing.lookup(plan, s, t[s.key], routes[s.key], b // (2 if split else 1))
               for s in rows}
        flags = jnp.stack([r.over for r in routes.values()])
        return embedding.sharded_lookup(plan, t, bt.ids, bt.mask, split, routed=got), flags

    out = P(("data", plan.axis)) if split else P("data")
    got, flags = jax.jit(jax.shard_map(routed, mesh=strat.mesh,
                                       in_specs=(strat.specs.tables, batch_specs(True)),
                                       out_specs=(out, P())))(placed.tables, strat.put_batch(batch))
    assert bool(np.any(np.asarray(flags))) == over
    sources = 8  # the host's capacity test (summary.json's count) agrees with the device's
    assert routing.host_over(plan, batch.ids, batch.mask, factor, sources) == over
    if not over:
        want = lookup(model.layout, state.tables, batch.ids, batch.mask)
        for g in want:
            np.testing.assert_array_equal(np.asarray(got[g]), np.asarray(want[g]), err_msg=g)

    strat, _, state, batches, ref, _ = _strategy("deepfm", mesh, MIXED_1D, MULTI_HOT,
                                                 pooling="mean", route=factor)
    s = strat.prepare(state)
    for bt in batches:
        s, _ = strat.train_step(s, strat.put_batch(bt))
    assert_states_close(ref, strat.unshard(s), rtol=1e-4, atol=1e-6)
    counted = strat.summary()["route_over_capacity"]
    assert counted == {"checked_batches": 2, "over": sum(
        routing.host_over(plan, bt.ids, bt.mask, factor, sources) for bt in batches)}
    assert counted["over"] == (0 if not over else 2)


def test_microbatched_step_inside_shard_map():
    """train.microbatches > 1 under shard_map (scan carry typed per mesh axis) == reference, and
    the dense gradient is all-reduced once per step, not once per slice."""
    import dataclasses

    strat, (model, tx, sopt), state, batches, ref, _ = _strategy("dlrm", "", ".*:row_wise")
    one = SyncStrategy(strat.setup, dataclasses.replace(model, microbatches=1), tx, sopt)
    one.prepare(state)
    strat = SyncStrategy(strat.setup, dataclasses.replace(model, microbatches=2), tx, sopt)
    s = strat.prepare(state)
    for b in batches:
        s, _ = strat.train_step(s, strat.put_batch(b))
    assert_states_close(ref, strat.unshard(s), rtol=1e-4, atol=1e-6)
    reduces = lambda st: sorted(  # noqa: E731
        r["bytes"] for r in st.comm["comm_collectives"] if r["op"] == "all_reduce")
    assert reduces(strat) == reduces(one)
    assert strat.comm["comm_bytes_per_step"] == one.comm["comm_bytes_per_step"]


def test_checkpoints_hold_the_reference_layout(tmp_path):
    """sync checkpoints are in the single-device layout: a fused (table_wise) sync run resumes,
    and a single-device checkpoint hands over to sync, both landing where a straight run does."""
    import dataclasses

    from algorithms import run
    from recjax import configs

    def cfg(out, steps, algo="sync", resume=False):
        c = configs.smoke()
        return dataclasses.replace(
            c, train=dataclasses.replace(c.train, algo=algo, devices=8 if algo == "sync" else 0,
                                         steps=steps, out=str(out), resume=resume, progress=False),
            spmd=dataclasses.replace(c.spmd, table_rules=".*:table_wise"))

    straight = run(cfg(tmp_path / "a", 16, algo="single"))
    run(cfg(tmp_path / "b", 8))
    resumed = run(cfg(tmp_path / "b", 16, resume=True))
    run(cfg(tmp_path / "c", 8, algo="single"))
    handed = run(cfg(tmp_path / "c", 16, resume=True))
    for got in (resumed, handed):
        assert got["resumed_from_step"] == 8 and got["steps"] == 16
        assert got["embedding_params"] == straight["embedding_params"]  # no padding rows counted
        # 16 steps of a composite (sharded lookups, all-reduced grads, Adam + Adagrad): 1e-4
        assert got["eval_logloss"] == pytest.approx(straight["eval_logloss"], rel=1e-4)
        assert got["train_ne"] == pytest.approx(straight["train_ne"], rel=1e-4)
