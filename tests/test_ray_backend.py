"""The Ray backend (``--backend ray``, algorithms/runtime/ray_backend.py, ray_ps.py,
ray_workers.py): the same roles with PS shards, worker groups and the algorithms' servers as
actor processes.

Every test that starts Ray is marked slow (``make test-all``, CI: 64 s for the first one
under load, Ray's start and the actors' JAX imports). Most tests share one local Ray instance
(the module fixture `cluster`, tests/conftest.py; a run that finds Ray running kills only its
own actors). The CLI's own instance and what is left of it after a run:
tests/test_ray_processes.py.
"""

import dataclasses
import os
import pathlib
import time
import types

import jax
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from algorithms import async_ps, gba, persia, shadowsync  # noqa: E402
from algorithms.runtime import ray_backend, ray_ps, ray_wire, ray_workers  # noqa: E402
from recjax.config import RayConfig  # noqa: E402
from tests.runtime_util import (  # noqa: E402
    assert_trees,
    on_ray,
    on_threads,
    reference,
    small_cfg,
    worker_batches,
)


def test_parse_kill():
    assert ray_backend.parse_kill("worker:0@5, ps:1@20") == {("worker", 0): 5, ("ps", 1): 20}
    assert ray_backend.parse_kill("") == {}
    for bad in ("worker:0", "gpu:0@1", "worker:x@1", "ps:0@0"):
        with pytest.raises(ValueError, match="ray.kill"):
            ray_backend.parse_kill(bad)


def test_backend_is_checked():
    import algorithms

    cfg = small_cfg("single", steps=2)
    with pytest.raises(ValueError, match="SPMD"):
        algorithms.run(dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime,
                                                                             backend="ray")))
    with pytest.raises(ValueError, match="deterministic"):
        algorithms.run(dataclasses.replace(small_cfg("async"), runtime=dataclasses.replace(
            cfg.runtime, backend="ray")))
    with pytest.raises(ValueError, match="runtime.backend"):
        dataclasses.replace(cfg.runtime, backend="mpi")


class _XlaThreads:
    """An actor body reporting the XLA threads its process runs a computation on."""

    def count(self) -> int:
        import jax.numpy as jnp

        jax.jit(lambda x: x @ x)(jnp.ones((64, 64))).block_until_ready()
        tasks = pathlib.Path("/proc/self/task")
        return sum((t / "comm").read_text().startswith("tf_XLAEigen") for t in tasks.iterdir())


@pytest.mark.slow
def test_actor_xla_threads(cluster):
    """A worker's process computes on one XLA thread, a group of m workers' on m (not on a
    pool as wide as the host, whichever the host: PJRT_NPROC)."""
    got = [ray.get(cluster.spawn(_XlaThreads, xla_threads=n).count.remote()) for n in (1, 3)]
    assert got == [1, 3]


@pytest.mark.slow
@pytest.mark.parametrize("roles", ["driver", "actors", "actors:3"])
def test_one_worker_equals_train_step(cluster, roles):
    """Async PS with one worker process: every pull sees the previous push (pushes are
    synchronous), so it is single-process training, as on threads; with the role in the
    driver's thread or in the worker's actor (which reads its own data there), and there with
    the dense PS as one actor or as 3 (``actors:3``, blocks of parameters)."""
    roles, _, dense = roles.partition(":")
    cfg = on_ray(small_cfg("async", steps=12, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                           trainers=1, workers_per_trainer=1), roles=roles,
                 dense_shards=int(dense or 1))
    s = async_ps.run(cfg)
    got = s["final_state"]
    want = reference(cfg, worker_batches(cfg, 0, 1, 12))
    assert s["backend"] == "ray" and int(got.step) == 12
    assert_trees(got.params, want.params, rtol=1e-4, atol=1e-7)
    assert_trees(got.tables, want.tables, rtol=1e-4, atol=1e-7)
    assert_trees(got.slots, want.slots, rtol=1e-4, atol=1e-7)
    assert s["staleness_histogram"] == {"0": 12}
    assert s["ray_worker_groups"] == 1 and s["lost_roles"] == [] and s["ps_restarts"] == 0


@pytest.mark.slow
def test_dense_shards_need_the_roles_in_the_actors(cluster):
    cfg = on_ray(small_cfg("async", steps=4, trainers=1, workers_per_trainer=1),
                 roles="driver", dense_shards=2)
    with pytest.raises(ValueError, match="needs the roles in the actors"):
        async_ps.run(cfg)


@pytest.mark.slow
def test_roles_in_actors_take_the_driver_one_call_per_chunk(cluster, monkeypatch):
    """With the roles in the actors the driver is off the per-step path: 40 steps of one
    worker in one chunk (``ray.chunk_s`` longer than the run) are one `advance` call, and the
    summary still counts every step, the staleness of every push and the worker's reads,
    made in its actor."""
    from algorithms.runtime import ray_role_driver

    calls = []
    call = ray_role_driver.ActorWorker._call

    def counted(self, method, *args):
        calls.append(method)
        return call(self, method, *args)

    monkeypatch.setattr(ray_role_driver.ActorWorker, "_call", counted)
    cfg = on_ray(small_cfg("async", steps=40, trainers=1, workers_per_trainer=1),
                 roles="actors", chunk_s=600.0)
    s = async_ps.run(cfg)
    assert calls == ["start_role", "advance"], calls
    assert s["steps"] == 40 and s["worker_iterations"] == 40
    assert s["staleness_histogram"] == {"0": 40}
    assert s["data_rows_read"]["by_reader"]["worker 0"] >= 40 * cfg.train.batch_size
    want = reference(cfg, worker_batches(cfg, 0, 1, 40))
    assert_trees(s["final_state"].params, want.params, rtol=1e-4, atol=1e-7)
    assert_trees(s["final_state"].tables, want.tables, rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_ps_actor_serves_the_same_rows_as_a_local_shard(cluster):
    """A shard actor's pull/push/push_sums/snapshot against `ps.EmbeddingPS` in this process,
    on the same rows and gradients (LRU store too): equal to the last bit."""
    from algorithms.runtime.engine import Runtime

    for store in ("fixed", "lru"):
        base = small_cfg("async", steps=4, sparse=("adagrad", 0.05))
        base = dataclasses.replace(base, embed=dataclasses.replace(base.embed, store=store,
                                                                   capacity=4096))
        rt_t = Runtime(on_threads(base), 1)
        rt_r = Runtime(on_ray(base), 1)
        try:
            local, rows = rt_t.warm_batch
            a = rt_t.ps.pull(rows)
            b = rt_r.ps.pull(rows)
            assert_trees(a, b, rtol=0, atol=0)
            _, _, rg = rt_t.grads(rt_t.init_state.params, a, local)
            for _ in range(3):
                rt_t.ps.push(rows, rg)
                rt_r.ps.push(rows, rg)
            assert_trees(rt_t.ps.snapshot(), rt_r.ps.snapshot(), rtol=0, atol=0)
            # GBA's PS0 pushes per-row sums (`push_sums`): over the wire only the real rows go
            _, _, sums = rt_t.grads_rows(rt_t.init_state.params, a, local)
            sums = {k: np.asarray(v) for k, v in sums.items()}
            before = [sh.pushes for sh in rt_r.ps.shards]
            rt_t.ps.push_sums(rows, sums)
            rt_r.ps.push_sums(rows, sums)
            assert [sh.pushes for sh in rt_r.ps.shards] == [p + bool(sh.names) for p, sh in
                                                           zip(before, rt_r.ps.shards)]
            assert_trees(rt_t.ps.snapshot(), rt_r.ps.snapshot(), rtol=0, atol=0)
        finally:
            rt_t.close()
            rt_r.close()


@pytest.mark.slow
@pytest.mark.parametrize("init, by_id", [("dlrm", False), ("0.05", True)])
def test_shards_draw_their_own_tables(cluster, monkeypatch, init, by_id):
    """Under Ray a fresh run's tables are drawn by the PS shard actors, never in the driver
    (whose host would otherwise hold every table): the driver's `init_tables` is made to
    fail, and the shards' tables and slots are, to the bit, the ones `build` draws for the
    threaded PS."""
    from algorithms.runtime.engine import Runtime
    from recjax.train import setup

    base = small_cfg("async", steps=4, sparse=("adagrad", 0.05), ps_shards=2)
    base = dataclasses.replace(base, embed=dataclasses.replace(base.embed, init=init,
                                                               init_by_id=by_id))
    rt_t = Runtime(on_threads(base), 1)
    try:
        want = rt_t.ps.snapshot()
    finally:
        rt_t.close()

    def no_tables_here(*a, **k):
        raise AssertionError("the driver drew the embedding tables")

    monkeypatch.setattr(setup, "init_tables", no_tables_here)
    rt_r = Runtime(on_ray(base), 1)
    try:
        assert sum(bool(sh.names) for sh in rt_r.ps.shards) == 2
        assert_trees(rt_r.ps.snapshot(), want, rtol=0, atol=0)
    finally:
        rt_r.close()


CONVERGE = {  # algorithm -> (config keywords); the tolerance is in the test
    "async": dict(trainers=2, workers_per_trainer=1),
    "shadow": dict(trainers=2, workers_per_trainer=2, sync="easgd"),
    "fr": dict(trainers=2, workers_per_trainer=1, sync="ma", sync_gap=4),
    "gba": dict(workers=4, mode="gba"),
    "persia": dict(nn_workers=2, embedding_workers=1, staleness=2),
}
CONVERGE_STEPS = 120  # within the first epoch: see the test
RUNNERS = {"async": async_ps.run, "shadow": shadowsync.run, "fr": shadowsync.run,
           "gba": gba.run, "persia": persia.run}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["async", "async-driver", "shadow", "fr", "gba", "persia"])
def test_converges_as_on_threads(cluster, algo):
    """Each algorithm reaches the eval NE of its threaded runs on the teacher data: the mean of
    two Ray runs at most 0.04 NE above the mean of two threaded runs (and not below the
    Bayes-optimal NE). One run is a noisy measurement: the interleaving of Hogwild pushes (and
    ShadowSync's background syncs) differs run to run on either backend, and Ray's slower
    calls only change the interleaving.

    120 steps: the first epoch (8,192 examples, B = 64: 128 steps). Past it the model
    overfits these 8K examples (threads, 3 runs each: FR's eval NE 0.951-0.955 at 125 steps, 0.950-
    0.961 at 200, 0.982-1.009 at 300, while its train NE falls 0.969 -> 0.925), and the second
    epoch's first steps spread it: four threaded runs each at 150 / 120 steps (idle AMD box,
    2026-11-28) gave FR 0.961-0.988 / 0.948-0.950, Persia 0.956-0.983 / 0.953-0.957, async
    0.935-0.975 / 0.950-0.964, S-EASGD 0.942-0.959 / 0.956-0.960, GBA 0.944-0.951 / 0.942-
    0.954. At 150 the ``< 0.99`` check failed in `.ci/run` twice on FR (once a Ray run at
    0.9956; once Ray 0.982 and 0.998 beside threaded 0.964 and 0.976). ``async`` runs its roles in the actors
    (``--ray.roles auto``), ``async-driver`` in the driver's threads."""
    algo, _, where = algo.partition("-")
    base = small_cfg(algo, steps=CONVERGE_STEPS, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                     **CONVERGE[algo])
    t, t2 = (RUNNERS[algo](on_threads(base)) for _ in range(2))
    r, r2 = (RUNNERS[algo](on_ray(base, roles=where or "auto")) for _ in range(2))
    assert r["backend"] == "ray" and t["backend"] == "threads"
    assert r["steps"] == r2["steps"] == t["steps"] == t2["steps"] == CONVERGE_STEPS
    want = (t["eval_ne"] + t2["eval_ne"]) / 2
    got = (r["eval_ne"] + r2["eval_ne"]) / 2
    ne = (r["eval_ne"], r2["eval_ne"], t["eval_ne"], t2["eval_ne"])
    # one-sided: Ray no worse than threads (a threaded run that went astray under the suite's
    # load, 1.026 beside Ray's 0.930 and 0.950 in one `make test-all`, is no Ray failure);
    # and no better than the data allow (an eval that under-reports stays caught)
    assert got - want < 0.04, ne
    assert got < 0.99, ne  # it learned (a constant predictor is 1.0)
    assert got > r["bayes_eval_ne"] - 0.02, (ne, r["bayes_eval_ne"])  # no better than Bayes
    assert r["lost_roles"] == [] and r["ps_restarts"] == 0
    # the counters the threaded run reports are there and add up
    if algo == "async":
        assert sum(r["staleness_histogram"].values()) == CONVERGE_STEPS
    if algo in ("shadow", "fr"):
        assert r["syncs"] > 0 and r["avg_sync_gap"] > 0
        assert r["worker_iterations"] == t["worker_iterations"]
    if algo == "gba":
        assert r["gradients_applied"] + r["dropped_gradients"] == r["tokens_handed_out"] == 4 * CONVERGE_STEPS
        assert r["updates"] == t["updates"] == CONVERGE_STEPS
    if algo == "persia":
        assert r["embedding_updates"] == CONVERGE_STEPS
        assert r["embedding_staleness"]["max"] <= 2


@pytest.mark.slow
@pytest.mark.parametrize("roles", ["driver", "actors"])
def test_killed_worker_ends_its_batch_and_the_run_goes_on(cluster, roles):
    """kill -9 of worker 0's process at its 5th iteration: that role ends, counted; the other
    worker trains its whole share; the model still learns."""
    base = small_cfg("async", steps=60, trainers=2, workers_per_trainer=1,
                     dense=("adam", 0.01), sparse=("adagrad", 0.05))
    s = async_ps.run(on_ray(base, kill="worker:0@5", roles=roles))
    assert len(s["lost_roles"]) == 1 and s["lost_roles"][0].startswith("worker0")
    assert s["worker_iterations"] == 4 + 30  # worker 0: 4 iterations; worker 1: its 30
    assert np.isfinite(s["eval_ne"]) and s["eval_ne"] < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("roles", ["driver", "actors"])
def test_killed_ps_shard_restarts_from_its_snapshot(cluster, roles):
    """kill -9 of PS shard 0's process before its 10th push: restarted from its snapshot
    (every 4 pushes); the run finishes every step. With the roles in the driver the snapshot
    is at push 8 and the one push since is lost; with the roles in the actors the driver
    counts pushes per chunk, the chunk is cut before push 10 and the snapshot due there (at 9)
    taken before the kill: none lost, and the worker's next pull finds the shard dead, waits
    for the restarted one and goes on. (Snapshots come at chunk ends: with chunks that end by
    time the one before the kill may be older, and pushes since it lost.)"""
    base = small_cfg("async", steps=40, trainers=1, workers_per_trainer=1,
                     dense=("adam", 0.01), sparse=("adagrad", 0.05))
    # one chunk until the cut (chunks that end by time under load would move the snapshots)
    s = async_ps.run(on_ray(base, kill="ps:0@10", snapshot_every=4, roles=roles,
                            chunk_s=600.0))
    assert s["ps_restarts"] == 1
    assert s["ps_pushes_lost"] == (1 if roles == "driver" else 0)
    assert s["steps"] == 40 and s["worker_iterations"] == 40
    assert np.isfinite(s["eval_ne"]) and s["eval_ne"] < 1.0


@pytest.mark.slow
def test_restarted_shard_keeps_the_state_it_was_set_to(cluster):
    """A shard set wholesale (a resumed checkpoint's rows, the optimizer step) and then killed
    restarts from that state, not from the tables it was built with; and one whose every
    snapshot died with it stops with `PsFailed` saying so (not a ``ray.get(None)`` error)."""
    from recjax.embeddings.sparse_optim import SparseOptimConfig

    rows = {"a": (np.arange(4), 4)}
    built, resumed = np.zeros((6, 3), np.float32), np.arange(18, dtype=np.float32).reshape(6, 3)
    args = (0, SparseOptimConfig(name="sgd", lr=0.1), {"a": built}, {"a": ()}, None)
    sh = ray_ps.ShardProxy(cluster, 0, ["a"], args, RayConfig(max_ps_restarts=2))
    try:
        sh.call("set_tables", {"a": resumed}, {"a": ()})
        sh.step = 7
        ray_backend.sigkill(sh.handle, sh.pid)
        np.testing.assert_array_equal(sh.pull(rows)["a"], resumed[:4])
        assert sh.restarts == 1 and sh.pushes_lost == 0 and sh.step == 7
        ray_backend.sigkill(sh.handle, sh.pid)
        sh._resnapshot()  # taken from the dead actor: no snapshot survives
        with pytest.raises(ray_ps.PsFailed, match="no snapshot of it survived"):
            sh.pull(rows)
    finally:
        ray.kill(sh.handle)


@pytest.mark.slow
def test_train_on_arrays_under_ray(cluster):
    """`recjax.fit` on an `ArraySource` (in this process only) under Ray: the driver reads the
    arrays and the actors get batches, so it learns the teacher as on threads."""
    import recjax
    from tests.test_api import _auc_ne, _teacher

    dense, ids, label, p, vocab = _teacher(6000, seed=3)
    train = recjax.ArraySource(label[:5000], dense[:5000], ids[:5000], vocab_sizes=vocab)
    valid = recjax.ArraySource(label[5000:], dense[5000:], ids[5000:], vocab_sizes=vocab)
    s = recjax.fit("smoke", train=train, eval=valid, overrides={
        "model.name": "lr", "train.batch_size": 128, "train.epochs": 2, "train.progress": False,
        "sparse.lr": 0.3, "dense.lr": 0.03, "train.algo": "async", "runtime.trainers": 2,
        "runtime.backend": "ray", "train.deterministic": False})
    bayes_auc, _ = _auc_ne(label[5000:], p[5000:])
    assert s["eval_examples"] == 1000 and s["ray_worker_groups"] >= 2
    assert s["eval_auc"] > bayes_auc - 0.05, (s["eval_auc"], bayes_auc)
    # `--ray.roles auto` kept the roles here; in the actors they could not read the arrays
    with pytest.raises(ValueError, match="in-memory source of this process only"):
        recjax.fit("smoke", train=train, eval=valid, overrides={
            "train.algo": "async", "runtime.backend": "ray", "train.deterministic": False,
            "ray.roles": "actors", "train.steps": 2})


@pytest.mark.slow
def test_no_request_reaches_a_restarted_shard_before_its_rows(cluster, monkeypatch):
    """While one thread restarts a dead shard, another thread's pull waits for the restored
    rows: the new actor is published only after its snapshot is restored. The second pull is
    made from inside the restart, just before the restore (a wrapped handle), so the order
    is forced; before, that pull reached the new, still empty actor."""
    import threading

    from recjax.embeddings.sparse_optim import SparseOptimConfig

    rows = {"a": (np.arange(4), 4)}
    table = np.arange(18, dtype=np.float32).reshape(6, 3)
    args = (0, SparseOptimConfig(name="sgd", lr=0.1), {"a": table}, {"a": ()}, None)
    sh = ray_ps.ShardProxy(cluster, 0, ["a"], args, RayConfig(max_ps_restarts=2))
    other = {}

    def pull_from_another_thread():
        try:
            other["rows"] = sh.pull(rows)["a"]
        except Exception as e:  # noqa: BLE001 (the assertion below shows it)
            other["rows"] = e

    class Handle:  # the new actor's handle; its restore first lets another thread pull
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        @property
        def restore(self):
            def remote(snap):
                t = threading.Thread(target=pull_from_another_thread)
                t.start()
                t.join(2.0)  # blocked on the restart's lock, as it should be, or done
                other["thread"] = t
                return self.real.restore.remote(snap)
            return types.SimpleNamespace(remote=remote)

    spawn = ray_ps.ShardProxy._spawn
    monkeypatch.setattr(ray_ps.ShardProxy, "_spawn",
                        lambda self: (lambda h, pid: (Handle(h), pid))(*spawn(self)))
    try:
        ray_backend.sigkill(sh.handle, sh.pid)
        np.testing.assert_array_equal(sh.pull(rows)["a"], table[:4])
        other["thread"].join(30)
        assert not isinstance(other["rows"], Exception), repr(other["rows"])
        np.testing.assert_array_equal(other["rows"], table[:4])
        assert sh.restarts == 1
    finally:
        ray.kill(getattr(sh.handle, "real", sh.handle))


@pytest.mark.slow
def test_a_push_that_finds_its_shard_dead_comes_back_to_the_driver(cluster):
    """`ComputeServer.step` pushes a batch's row gradients from the worker actor; a push
    whose shard actor died returns them (`failed`), and the driver's retry on the restarted
    shard updates it as a direct push of the step's per-entry row gradients does (numpy's
    SGD on the pulled rows is the reference, not the backend's code). GBA's step returns the
    real rows' sums instead and pushes nothing."""

    from algorithms.runtime import ps as ps_lib
    from recjax.data.synthetic import SyntheticSource
    from recjax.train.setup import build

    cfg = small_cfg("async", sparse=("sgd", 0.5))
    src = SyntheticSource(cfg.synthetic)
    model, _, _, state = build(cfg, src.spec)
    names = [t.name for t in model.layout.tables]
    server = ray_workers.ComputeServer(cfg, src.spec, cfg.train.batch_size, [names])
    local, rows = ps_lib.localize(model.layout, worker_batches(cfg, 0, 1, 1)[0])
    tables = {k: np.asarray(state.tables[k]) for k in names}
    args = (0, cfg.sparse, tables, {k: () for k in names}, None)
    live, dead = (cluster.spawn(ray_ps.ShardServer, *args) for _ in range(2))
    ray.get(dead.pid.remote())
    ray.kill(dead)
    split = types.SimpleNamespace(pull_rows=live.pull_rows, push_rows=dead.push_rows)
    try:
        (m, failed, secs), g, none = server.step(state.params, local, False, True,
                                                  [(split, ray_wire.wire_rows(rows))])
        assert none is None and set(failed) == {0} and secs > 0
        _, _, per_entry = server.compute(state.params, local, False, ray.get(live.pull.remote(rows)))
        # the driver's retry (`RayWorker.push` of the step's `_Pushed`) through a proxy of
        # the live shard
        proxy = types.SimpleNamespace(names=names, call=lambda method, *a: ray.get(
            getattr(live, method).remote(*a)))
        worker = types.SimpleNamespace(rt=types.SimpleNamespace(ps=types.SimpleNamespace(
            shards=[proxy], _part=ray_ps.RayEmbeddingPS._part)),
            counters=types.SimpleNamespace(iterations=0))
        ray_workers.RayWorker.push(worker, ray_workers._Pushed(rows, failed))
        assert worker.counters.iterations == 1
        got = ray.get(live.snapshot.remote())[0]
        for k in names:
            ids, n = rows[k]
            want = tables[k].copy()
            entry_local, entry_g = per_entry[k]
            np.add.at(want, ids[np.asarray(entry_local)], -0.5 * np.asarray(entry_g))
            np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6, err_msg=k)
        assert any(not np.array_equal(got[k], tables[k]) for k in names)
        # GBA's step (coalesce, no push): each shard's real rows' sums come back for PS0,
        # the first n of the per-row sums the step computes, nothing pushed
        before = ray.get(live.snapshot.remote())[0]
        (m, failed, _), g, sums = server.step(state.params, local, True, False,
                                              [(live, ray_wire.wire_rows(rows))])
        _, _, full = server.compute(state.params, local, True, ray.get(live.pull.remote(rows)))
        assert failed == {}
        for k in names:
            n = rows[k][1]
            assert sums[k].shape == (n, full[k].shape[1])
            np.testing.assert_array_equal(sums[k], full[k][:n])
            np.testing.assert_array_equal(ray.get(live.snapshot.remote())[0][k], before[k])
    finally:
        ray.kill(live)


@pytest.mark.slow
def test_a_stragglers_push_lands_after_its_slowdown(cluster):
    """A role pushes its rows after its step's `Work`, the straggler's modelled slowdown. On
    threads that is the order of the calls; a Ray worker's actor pushes inside its step unless
    the step straggles: then the shards' rows stay as they were until the role's `push`,
    which applies the update the threaded worker's push applies."""
    from algorithms.runtime.engine import Runtime

    base = small_cfg("async", steps=4, sparse=("sgd", 0.5), trainers=1, workers_per_trainer=1,
                     stragglers="slow:k=1,factor=3")
    rt_t, rt_r = Runtime(on_threads(base), 1), Runtime(on_ray(base, roles="driver"), 1)
    try:
        item, params = (0, rt_t.warm_batch), rt_t.init_state.params
        before = rt_r.ps.snapshot()
        assert_trees(before, rt_t.ps.snapshot(), rtol=0, atol=0)
        after = []
        for rt in (rt_t, rt_r):
            worker = rt.placement.worker(0, None)
            t0 = time.perf_counter()
            _, pending, work = worker.compute(params, item, 0)
            # the slowdown scales the gradient computation the actor timed, not the call
            assert work.factor == 3 and 0 < work.measured < time.perf_counter() - t0
            assert_trees(rt.ps.snapshot(), before, rtol=0, atol=0)  # nothing pushed yet
            worker.push(pending)
            assert worker.counters.iterations == 1
            after.append(rt.ps.snapshot())
        assert any(not np.array_equal(after[1][0][k], before[0][k]) for k in before[0])
        assert_trees(after[1], after[0], rtol=1e-5, atol=1e-6)
        assert [sh.pushes for sh in rt_r.ps.shards] == [int(bool(sh.names))
                                                       for sh in rt_r.ps.shards]
    finally:
        rt_t.close()
        rt_r.close()


def _sum_of_square(ctx, n):
    """A `remote_fn` factory, (x @ x).sum() of x's first n x n, slow to build: a call that does
    not wait for the build reaches the actor before the function is there."""
    time.sleep(0.5)
    return lambda x: (x[:n, :n] @ x[:n, :n]).sum()


@pytest.mark.slow
def test_a_remote_fn_times_its_computation_in_the_actor(cluster):
    """`RemoteFn.timed` (Persia's NN worker under a straggler) returns the function's result, as
    the threaded `LocalFn` does, and the seconds the actor spent computing it: less than the
    call's wall time, which also holds the round trip of the 4 MB argument (on threads, the
    same call: nothing around the function to leave out). The first call comes right after
    the function was built: the build is waited for."""
    from algorithms.runtime.engine import Runtime

    base = small_cfg("persia", steps=2)
    # small integers: every product and partial sum is exact in float32, in any order
    x = np.random.default_rng(0).integers(-2, 3, (1024, 1024)).astype(np.float32)
    want = float((x[:128, :128].astype(np.int64) @ x[:128, :128].astype(np.int64)).sum())
    for cfg in (on_threads(base), on_ray(base)):
        rt = Runtime(cfg, 1)
        try:
            fn = rt.placement.remote_fn(0, "sum_of_square", _sum_of_square, 128)
            assert float(fn(x)) == want  # (compiles)
            t0 = time.perf_counter()
            out, secs = fn.timed(x)
            took = time.perf_counter() - t0
            assert float(out) == want and 0 < secs < took
        finally:
            rt.close()


@pytest.mark.slow
def test_ps_lost_for_good_stops_with_a_restorable_checkpoint(cluster, tmp_path):
    """With no restart allowed, a killed PS shard stops the run with `PsFailed`, saying why,
    and a checkpoint (that shard at its last snapshot) that threads resume to the end."""
    out = str(tmp_path / "run")
    base = small_cfg("async", steps=40, trainers=1, workers_per_trainer=1, train={"out": out})
    with pytest.raises(ray_ps.PsFailed, match="max_ps_restarts=0"):
        async_ps.run(on_ray(base, kill="ps:0@10", snapshot_every=4, max_ps_restarts=0))
    ckpts = [int(d) for d in os.listdir(os.path.join(out, "checkpoints")) if d.isdigit()]
    assert ckpts and 8 <= max(ckpts) < 40
    cont = dataclasses.replace(base, train=dataclasses.replace(base.train, resume=True))
    s = async_ps.run(on_threads(cont))
    assert s["steps"] == 40 and np.isfinite(s["eval_ne"])


@pytest.mark.slow
def test_gba_on_ray_with_ids_beyond_the_store_capacity(cluster):
    """Issue 40 item 1 under Ray: PS0 in its own process keys its per-id tags by raw id."""
    base = small_cfg("gba", steps=8, sparse=("adagrad", 0.05), workers=4, local_batch_size=16,
                     embedding_staleness="id", iota=1)
    base = dataclasses.replace(base, embed=dataclasses.replace(base.embed, store="lru",
                                                               capacity=60))
    s = gba.run(on_ray(base))
    assert s["backend"] == "ray" and s["lru"]["total"]["evicted"] > 0
    assert s["tagged_ids"] > 4 * 60 and np.isfinite(s["eval_ne"])


@pytest.mark.slow
def test_a_hosted_server_lost_between_intervals_names_the_latest_checkpoint(cluster, tmp_path,
                                                                           monkeypatch):
    """GBA's PS0 actor killed between two checkpoint intervals (its process is kept for the
    next interval's server, `RayPlacement.host`): the run stops with `StateLost` naming the
    checkpoint the interval committed (the CLI's one-line error), not with Ray's own error
    and a traceback (seen once in scripts/faults.py --ray-cases on a loaded box)."""
    from algorithms.runtime import ray_placement
    from algorithms.runtime.segments import StateLost

    end = ray_placement.RayPlacement.end_interval

    def end_and_kill(self):
        end(self)
        for handles in self.spare.values():
            for h in handles:
                ray_backend.sigkill(h, ray.get(h.pid.remote()))

    monkeypatch.setattr(ray_placement.RayPlacement, "end_interval", end_and_kill)
    base = small_cfg("gba", steps=16, workers=2, mode="sync",
                     train={"out": str(tmp_path / "run"), "ckpt_every": 8})
    with pytest.raises(StateLost, match="GbaServer died as the next checkpoint interval began; "
                                        "the latest committed checkpoint is step 8"):
        gba.run(on_ray(base))
