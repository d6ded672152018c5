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
def test_fr_easgd_in_the_trainers_actor_is_train_step_with_its_exchanges(cluster, monkeypatch):
    """FR-EASGD with one trainer of one worker is deterministic whatever the timing: its
    worker's role, run in the trainer's actor with the replica there, is the single trainer's
    `train_step` with an exchange with wPS (hosted in an actor of its own) after every k = 2
    iterations (the reference by hand, not the backend); the driver takes and computes no
    step; the syncs and their bytes are counted from the actor."""
    _no_role_here(monkeypatch)
    steps, k, alpha = 8, 2, 0.5
    cfg = on_ray(small_cfg("fr", steps=steps, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                           trainers=1, workers_per_trainer=1, sync="easgd", alpha=alpha,
                           sync_gap=k), roles="actors")
    s = shadowsync.run(cfg)
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


@pytest.mark.slow
def test_shadow_trainers_in_their_actors_sync_in_the_background_and_resume_on_threads(
        cluster, monkeypatch, tmp_path):
    """S-EASGD, 2 trainers of 2 Hogwild workers, each trainer an actor with its workers and
    its shadow: every worker trains its share there, the shadows sync (counted), the model
    learns; the checkpoint holds both replicas and wPS as read from their actors, and a
    ``--resume`` on threads goes on from them to the end."""
    _no_role_here(monkeypatch)
    base = small_cfg("shadow", steps=32, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                     trainers=2, workers_per_trainer=2, sync="easgd", shadow_interval_ms=20)
    out = tmp_path / "run"
    cfg = on_ray(base, roles="actors")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out=str(out)))
    s = shadowsync.run(cfg)
    assert s["backend"] == "ray" and s["steps"] == 32 and s["worker_iterations"] == 32
    assert s["lost_roles"] == [] and s["syncs"] > 0
    assert s["avg_sync_gap"] == pytest.approx(32 / s["syncs"])
    assert np.isfinite(s["eval_ne"]) and s["eval_ne"] < 1.0
    readers = s["data_rows_read"]["by_reader"]
    assert sum(readers[f"worker {w}"] for w in range(4)) >= 32 * 64, readers  # (+ read ahead)
    monkeypatch.undo()
    more = dataclasses.replace(on_threads(cfg), train=dataclasses.replace(
        on_threads(cfg).train, steps=40, resume=True, out=str(out)))
    more = dataclasses.replace(more, runtime=dataclasses.replace(more.runtime,
                                                                 backend="threads"))
    r = shadowsync.run(more)
    assert r["backend"] == "threads" and r["steps"] == 40
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
