"""ShadowSync with its roles in the Ray worker actors (``--ray.roles actors``, the default under
``--backend ray`` for ``--sync easgd`` and ``none``; algorithms/runtime/ray_roles.py): a
trainer is one actor running its m Hogwild worker roles and its shadow role, its replica held
there (`ray_role_worker.GroupLocal`), the EASGD sync PS in an actor of its own.

Slow tests (Ray): ``make test-all``. The chunk gate without Ray: tests/test_ray_roles_gate.py.
"""

import dataclasses
import functools

import jax
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from algorithms import shadowsync  # noqa: E402
from tests.runtime_util import (  # noqa: E402
    assert_trees,
    on_ray,
    on_threads,
    small_cfg,
    worker_batches,
)


def _no_role_here(monkeypatch):
    """Fail if a worker's step is taken or computed in the driver."""
    from algorithms.runtime import ray_workers, supply

    def here(*_):
        raise AssertionError("a worker's batch was taken or computed in the driver")

    monkeypatch.setattr(supply.StaticShards, "take", here)
    monkeypatch.setattr(ray_workers.RayWorker, "compute", here)


def _kept_rows(monkeypatch) -> dict:
    """Filled, once the run's worker actors opened their data: each group's training examples
    held in its actor (`RoleServer.kept_rows`)."""
    from algorithms.runtime import ray_placement

    kept, warm = {}, ray_placement.RayPlacement.warm

    def spy(self, *args, **kwargs):
        warm(self, *args, **kwargs)
        for g, h in self.groups.handles.items():
            kept[g] = ray.get(h.kept_rows.remote())

    monkeypatch.setattr(ray_placement.RayPlacement, "warm", spy)
    return kept


def _reference(cfg, batch_list, k: int, alpha: float):
    """One trainer of one worker by hand: `train_step` on each batch, and after every k-th an
    S-EASGD exchange of its dense params with wPS, Alg. 2's two lines in order, in numpy."""
    from recjax.data.synthetic import SyntheticSource
    from recjax.train.setup import build
    from recjax.train.step import jit_train_step

    model, tx, sopt, state = build(cfg, SyntheticSource(cfg.synthetic).spec)
    step = jit_train_step(model, tx, sopt)
    copy = functools.partial(jax.tree.map, np.array)  # the step donates its input buffers
    a = np.float32(alpha)
    w_ps = copy(state.params)
    for i, b in enumerate(batch_list):
        state, _ = step(state, b)
        if (i + 1) % k == 0:
            w = copy(state.params)
            w_ps = jax.tree.map(lambda ps, x: (1 - a) * ps + a * x, w_ps, w)  # wPS first
            w = jax.tree.map(lambda x, ps: (1 - a) * x + a * ps, w, w_ps)  # reads the new wPS
            state = state._replace(params=w)
    return state, w_ps


@pytest.mark.slow
@pytest.mark.parametrize("shards", [1, 3])
def test_fr_easgd_in_the_trainers_actor_is_train_step_with_its_exchanges(cluster, monkeypatch,
                                                                        shards):
    """FR-EASGD with one trainer of one worker is deterministic whatever the timing: its
    worker's role, run in the trainer's actor with the replica there, is the single trainer's
    `train_step` with an exchange with wPS (hosted in an actor of its own; with
    ``--ray.dense_shards 3`` in three, each holding a block of it, `ray_dense.SyncShards`)
    after every k = 2 iterations (the reference by hand, not the backend); the driver takes
    and computes no step; the syncs and their bytes are counted from the actor."""
    from algorithms.runtime import ray_dense, ray_placement

    _no_role_here(monkeypatch)
    made, host_blocks = [], ray_placement.RayPlacement.host_blocks
    monkeypatch.setattr(ray_placement.RayPlacement, "host_blocks",
                        lambda self, *a, **k: made.append(host_blocks(self, *a, **k)) or made[-1])
    steps, k, alpha = 8, 2, 0.5
    cfg = on_ray(small_cfg("fr", steps=steps, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                           trainers=1, workers_per_trainer=1, sync="easgd", alpha=alpha,
                           sync_gap=k), roles="actors", dense_shards=shards)
    s = shadowsync.run(cfg)
    if shards > 1:
        assert isinstance(made[0], ray_dense.SyncShards) and len(made[0].servers) == 3
    want, _ = _reference(cfg, worker_batches(cfg, 0, 1, steps), k, alpha)
    got = s["final_state"]
    assert s["backend"] == "ray" and int(got.step) == steps and s["lost_roles"] == []
    assert s["syncs"] == steps // k and s["avg_sync_gap"] == k
    dense = sum(int(np.size(x)) * 4 for x in jax.tree.leaves(want.params))
    assert s["sync_bytes"] == steps // k * 2 * dense
    # (float32 rounding of the exchange, XLA's against numpy's, reaches the rows' Adagrad
    # updates through the gradients: one row element in 8,000 differed by 9e-6)
    assert_trees(got.params, want.params, rtol=1e-4, atol=1e-6)
    assert_trees(got.tables, want.tables, rtol=1e-4, atol=3e-5)
    assert_trees(got.slots, want.slots, rtol=1e-4, atol=1e-6)


# The embedding rows move by ~1e-12 a step at this rate, below float32's rounding of them: the
# interleaving of two trainers' pulls and pushes, which real time does not fix, cannot change
# what a pull reads, so the dense replicas' trajectory is determined and a hand reference holds.
STILL_ROWS = ("sgd", 1e-9)


def _fr_reference(cfg, n: int, per_trainer: int, k: int, alpha: float, eta: float = 1.0,
                  mu: float = 0.0, nesterov: bool = False, rule: str = "bmuf"):
    """n trainers of one worker by hand, in numpy: each trainer's `train_step` on its own
    batches, and after every k-th iteration Alg. 3 (MA: ``w_i <- (1-a) w_i + a mean``) or
    Alg. 4 with block momentum (Chen & Huo 2016: ``d = mean - g; D = mu D + eta d; g += D``,
    ``w_i`` towards ``g`` or with Nesterov ``g + mu D``). Returns each trainer's params."""
    from recjax.data.synthetic import SyntheticSource
    from recjax.train.setup import build
    from recjax.train.step import jit_train_step

    model, tx, sopt, state = build(cfg, SyntheticSource(cfg.synthetic).spec)
    step = jit_train_step(model, tx, sopt)
    copy = functools.partial(jax.tree.map, np.array)  # the step donates its input buffers
    states = [copy(state) for _ in range(n)]
    data = [worker_batches(cfg, i, n, per_trainer) for i in range(n)]
    a, eta, mu = np.float32(alpha), np.float32(eta), np.float32(mu)
    g = copy(state.params)
    big_d = jax.tree.map(np.zeros_like, g)
    for t in range(per_trainer):
        for i in range(n):
            states[i], _ = step(states[i], data[i][t])
        if (t + 1) % k:
            continue
        ws = [copy(st.params) for st in states]
        mean = jax.tree.map(lambda *x: functools.reduce(np.add, x) / np.float32(n), *ws)
        if rule == "ma":
            target = mean
        else:
            big_d = jax.tree.map(lambda dd, c, gg: mu * dd + eta * (c - gg), big_d, mean, g)
            g = jax.tree.map(np.add, g, big_d)
            target = jax.tree.map(lambda gg, dd: gg + mu * dd, g, big_d) if nesterov else g
        for i in range(n):
            w = jax.tree.map(lambda x, tt: (1 - a) * x + a * tt, ws[i], target)
            states[i] = states[i]._replace(params=w)
    return [st.params for st in states]


@pytest.mark.slow
@pytest.mark.parametrize("shards", [1, 3])
def test_fr_ma_in_the_trainers_actors_is_sync_sgd_on_the_global_batch(cluster, monkeypatch,
                                                                      shards):
    """FR-MA with k = 1 and a = 1 across two trainers' actors, their all-reduce group hosted
    in an actor of its own (`ray_wire.Collectives`; with ``--ray.dense_shards 3`` three, each
    reducing one block of the parameters, `ray_wire.BlockGroup`): every replica is the hand
    reference's (Alg. 3 in numpy after each trainer's `train_step`), i.e. sync SGD on the
    global batch; the syncs and their bytes (the ring's, 2 (n-1)/n P a party) are counted in
    the actors; the driver takes and computes no step."""
    from algorithms.runtime import ray_placement, ray_wire

    _no_role_here(monkeypatch)
    made, rendezvous = [], ray_placement.RayPlacement.rendezvous
    monkeypatch.setattr(ray_placement.RayPlacement, "rendezvous",
                        lambda self, *a: made.extend(rendezvous(self, *a)) or made)
    n, per = 2, 6
    cfg = on_ray(small_cfg("fr", steps=n * per, sparse=STILL_ROWS, trainers=n,
                           workers_per_trainer=1, sync="ma", alpha=1.0, sync_gap=1),
                 roles="actors", dense_shards=shards)
    s = shadowsync.run(cfg)
    if shards > 1:  # three hosts, each with its block of whole leaves
        assert [type(g) for g in made] == [ray_wire.BlockGroup]
        assert len({h.handle for h in made[0].parts}) == 3 and len(made[0].cut) == 3
    want = _fr_reference(cfg, n, per, 1, 1.0, rule="ma")
    assert s["backend"] == "ray" and s["lost_roles"] == [] and s["worker_iterations"] == n * per
    assert s["syncs"] == n * per and s["avg_sync_gap"] == 1.0
    dense = sum(int(np.size(x)) * 4 for x in jax.tree.leaves(want[0]))
    assert s["sync_bytes"] == n * per * int(2 * (n - 1) / n * dense)
    assert_trees(want[0], want[1], rtol=0, atol=0)  # (the reference's own check: a = 1)
    assert_trees(s["final_state"].params, want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fr_bmuf_in_the_trainers_actors_checkpoints_its_block_momentum_from_there(
        cluster, monkeypatch, tmp_path):
    """FR-BMUF (block momentum, Nesterov, a = 0.5, k = 2) across two trainers' actors, 4
    iterations each, then ``--resume`` on the virtual clock to 8 each: the resumed run's
    replica is the hand reference's 8 iterations (Alg. 4 in numpy), which holds only if the
    checkpoint kept each party's BMUF state (g, D) as its actor left it (the driver never
    sees it change) and every replica."""
    _no_role_here(monkeypatch)
    n, per, k = 2, 4, 2
    bmuf = dict(sync="bmuf", alpha=0.5, bmuf_lr=0.8, bmuf_momentum=0.5, nesterov=True,
                sync_gap=k)
    base = small_cfg("fr", steps=n * per, sparse=STILL_ROWS, trainers=n, workers_per_trainer=1,
                     train={"out": str(tmp_path / "run")}, **bmuf)
    s = shadowsync.run(on_ray(base, roles="actors"))
    assert s["backend"] == "ray" and s["syncs"] == n * per // k and s["lost_roles"] == []
    monkeypatch.undo()
    more = dataclasses.replace(base, train=dataclasses.replace(base.train, steps=2 * n * per,
                                                               resume=True))
    r = shadowsync.run(more)  # the virtual clock
    assert r["clock"] == "virtual" and r["syncs"] == 2 * n * per // k
    want = _fr_reference(base, n, 2 * per, k, 0.5, eta=0.8, mu=0.5, nesterov=True)
    assert_trees(r["final_state"].params, want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_killed_trainer_releases_its_peers_from_the_all_reduce(cluster):
    """FR-MA (k = 2), kill -9 of trainer 1's actor before its 5th iteration (after the sync
    that ends its 4th: a chunk of n batches ends after the n-th iteration's sync, within the
    chunk's seconds, here 5 s so that a slow peer does not cut it): trainer 0, which waits for
    it in the sync after its 6th, is released (the driver closes the group for the dead
    party, as a role's ``finally`` does in a thread) and its role ends there, as on threads;
    the run returns trainer 0's replica instead of hanging."""
    base = small_cfg("fr", steps=40, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                     trainers=2, workers_per_trainer=1, sync="ma", sync_gap=2)
    s = shadowsync.run(on_ray(base, kill="worker:1@5", roles="actors", chunk_s=5.0))
    assert any(r.startswith("t1-worker0:") for r in s["lost_roles"]), s["lost_roles"]
    assert s["worker_iterations"] == 6 + 4 and s["syncs"] == 2 + 2
    assert np.isfinite(s["eval_ne"])


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["easgd", "bmuf"])
def test_shadow_trainers_in_their_actors_sync_in_the_background_and_resume_on_threads(
        cluster, monkeypatch, tmp_path, rule):
    """S-EASGD and S-BMUF, 2 trainers of 2 Hogwild workers, each trainer an actor with its
    workers and its shadow: every worker trains its share there, the shadows sync (counted;
    BMUF's all-reduce among the shadows' actors through the hosted groups, 2 blocks), the
    model learns; the checkpoint holds both replicas and wPS (read from its 2 block actors)
    or the shadows' BMUF states as read from their actors, and a ``--resume`` on threads goes
    on from them to the end.

    S-BMUF runs 96 steps. At 32 its few syncs, each crossing three processes (the two
    trainers' actors and the group's) while the workers go on, left the returned replica
    at eval NE 1.019-1.023 in 3 Ray runs (threads 0.972, 0.978), and at 64 steps both
    backends were still noisy (Ray 0.974, 0.976; threads 0.965, 1.034); at 96, Ray 0.957
    and 0.979 with 26-30 syncs (threads 0.953, 0.963). S-EASGD runs 64: at 32 it reached
    0.986 and 0.986 alone but 1.008 once in `make test-all` (2026-11-29); at 64, 0.962 and
    0.973 with a second Ray run beside it."""
    _no_role_here(monkeypatch)
    extra = dict(bmuf_lr=0.8, bmuf_momentum=0.5) if rule == "bmuf" else {}
    steps = 96 if rule == "bmuf" else 64
    base = small_cfg("shadow", steps=steps, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                     trainers=2, workers_per_trainer=2, sync=rule, shadow_interval_ms=20,
                     **extra)
    out = tmp_path / "run"
    # wPS and the shadows' all-reduce cut into 2 blocks: the checkpoint holds them joined
    cfg = on_ray(base, roles="actors", dense_shards=2)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out=str(out)))
    kept = _kept_rows(monkeypatch)
    s = shadowsync.run(cfg)
    # each trainer's actor holds its two workers' examples (row % 4 in {2t, 2t + 1}), not all
    assert kept == {t: int(np.isin(np.arange(8192) % 4, (2 * t, 2 * t + 1)).sum())
                    for t in range(2)}, kept
    assert s["backend"] == "ray" and s["steps"] == steps and s["worker_iterations"] == steps
    assert s["lost_roles"] == [] and s["syncs"] > 0
    assert s["avg_sync_gap"] == pytest.approx(steps / s["syncs"])
    assert np.isfinite(s["eval_ne"]) and s["eval_ne"] < 1.0
    readers = s["data_rows_read"]["by_reader"]
    assert sum(readers[f"worker {w}"] for w in range(4)) >= steps * 64, readers  # (+ read ahead)
    monkeypatch.undo()
    more = dataclasses.replace(on_threads(cfg), train=dataclasses.replace(
        on_threads(cfg).train, steps=steps + 8, resume=True, out=str(out)))
    more = dataclasses.replace(more, runtime=dataclasses.replace(more.runtime,
                                                                 backend="threads"))
    r = shadowsync.run(more)
    assert r["backend"] == "threads" and r["steps"] == steps + 8
    assert r["syncs"] > s["syncs"]  # the run's syncs so far came with the checkpoint
    assert np.isfinite(r["eval_ne"])


@pytest.mark.slow
def test_a_killed_trainer_ends_its_roles_and_its_replica_is_lost(cluster):
    """kill -9 of trainer 1's actor before its worker's 5th iteration: its worker's and its
    shadow's roles end (counted), trainer 0 trains its whole share and the run returns
    trainer 0's replica; returning the replicas' average reads the dead one: the run stops
    with `StateLost` naming it, not with a number made without it."""
    from algorithms.runtime.segments import StateLost

    base = small_cfg("shadow", steps=40, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                     trainers=2, workers_per_trainer=1, sync="easgd")
    s = shadowsync.run(on_ray(base, kill="worker:1@5", roles="actors"))
    assert any(r.startswith("t1-worker0:") for r in s["lost_roles"]), s["lost_roles"]
    assert s["worker_iterations"] == 20 + 4  # trainer 0: its 20; trainer 1: 4
    assert np.isfinite(s["eval_ne"]) and s["eval_ne"] < 1.0
    avg = dataclasses.replace(base, shadowsync=dataclasses.replace(base.shadowsync,
                                                                   return_model="average"))
    with pytest.raises(StateLost, match="Replica-1"):
        shadowsync.run(on_ray(avg, kill="worker:1@5", roles="actors"))


@pytest.mark.slow
def test_a_killed_sync_ps_stops_the_run_naming_it(cluster):
    """kill -9 of the EASGD sync PS's actor (wPS: state that is not restarted) while the
    shadows sync: the run stops within seconds with `StateLost` naming the sync PS, not a hang
    of the shadows waiting on it nor a model returned without it."""
    import os
    import signal
    import threading
    import time

    from algorithms.runtime.segments import StateLost

    base = small_cfg("shadow", steps=100_000, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                     trainers=2, workers_per_trainer=1, sync="easgd")
    got: list = []
    old = set(_descendants("ray::_Host"))  # an earlier test's, exiting: not this run's
    run = threading.Thread(target=lambda: got.append(_outcome(shadowsync.run, on_ray(
        base, roles="actors"))), daemon=True)
    run.start()
    deadline, pid = time.time() + 180, None
    while pid is None and time.time() < deadline and run.is_alive():
        hosts = [p for p in _descendants("ray::_Host") if p not in old]  # the sync PS
        if hosts:
            time.sleep(3)  # the shadows sync with it meanwhile
            try:
                os.kill(hosts[0], signal.SIGKILL)
                pid = hosts[0]
            except ProcessLookupError:  # gone meanwhile: not the run's sync PS
                old.add(hosts[0])
        time.sleep(0.5)
    assert pid is not None, got
    t_kill = time.time()
    run.join(120)
    assert not run.is_alive(), "the run hung after its sync PS died"
    assert time.time() - t_kill < 60
    (e,) = got
    assert isinstance(e, StateLost) and "SyncPS" in str(e), repr(e)


def _outcome(fn, *args):
    try:
        return fn(*args)
    except BaseException as e:  # the test reads what the run raised
        return e


def _descendants(name: str) -> list[int]:
    """Pids of this process's descendants (a local Ray instance: its raylet, its workers and
    actors) whose command line starts with `name`; never another test's (pytest-xdist)."""
    import os

    parent, cmd = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            if state == "Z":  # exited, not yet reaped
                continue
            parent[int(pid)] = int(ppid)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return [p for p, c in cmd.items() if c.startswith(name) and ours(p)]


@pytest.mark.slow
def test_dense_shards_without_a_sync_server_is_refused(cluster):
    """``--ray.dense_shards`` under ``--sync none``: no sync PS, no all-reduce, so nothing to
    cut into blocks; refused before a role runs, not trained as if the flag were not there."""
    base = small_cfg("shadow", steps=8, trainers=2, workers_per_trainer=1, sync="none")
    with pytest.raises(ValueError, match="--ray.dense_shards 2: this run has no dense server"):
        shadowsync.run(on_ray(base, roles="actors", dense_shards=2))
