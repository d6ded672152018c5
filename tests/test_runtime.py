"""The runtime's machinery: thread group, both interpreters, stragglers, clean shutdown."""

import _thread
import os
import signal
import threading
import time
import traceback

import pytest

from algorithms import shadowsync
from algorithms.runtime import (
    Collective,
    Link,
    Rendezvous,
    RoleSpec,
    Work,
    Worker,
    run_threaded,
    run_virtual,
    stragglers,
)
from algorithms.runtime.ps import EmbeddingShard
from recjax.checkpoint import Checkpointer
from recjax.concurrency import ThreadGroup
from tests.runtime_util import assert_trees, small_cfg


def runtime_threads():
    return [t for t in threading.enumerate()
            if t.name.startswith(("recjax-rt", "recjax-prefetch-w", "recjax-test"))]


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    deadline = time.monotonic() + 2.0
    while runtime_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runtime_threads() == []


def test_thread_group_reraises_with_traceback():
    def bad(stop):
        raise KeyError("boom in a worker")

    def good(stop):
        stop.wait(30)

    g = ThreadGroup("recjax-test")
    g.spawn(good, g.stop, name="good")
    g.spawn(bad, g.stop, name="bad")
    t0 = time.monotonic()
    with pytest.raises(KeyError, match="boom") as e:
        g.wait()
    assert "bad" in [f.name for f in traceback.extract_tb(e.value.__traceback__)]
    assert g.close() == [] and time.monotonic() - t0 < 2.0


def toy_worker(log, name, n, cost, group=None, index=0):
    try:
        for i in range(n):
            log.append((name, i))
            yield Work(cost)
            if group is not None:
                got = yield Collective(group, index, index + 1)
                log.append((name, "sum", got))
    finally:
        if group is not None:
            group.close()  # as the real roles do: peers waiting on a departed party are released


def bad_role():
    yield Work()
    raise ValueError("role failed")


def test_virtual_clock_orders_events_and_links_queue():
    log = []
    roles = [RoleSpec("a", toy_worker(log, "a", 3, 2.0)), RoleSpec("b", toy_worker(log, "b", 3, 3.0))]
    sched = run_virtual(roles)
    # a at 0, 2, 4; b at 0, 3, 6: ties go to the first scheduled
    assert [x for x in log] == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert sched.seconds == 9.0
    link = Link("ps", bandwidth=100.0)
    assert link.virtual(0.0, 100) == 1.0 and link.virtual(0.5, 100) == 2.0  # queued behind
    assert link.virtual(5.0, 50) == 5.5 and link.bytes == 250


@pytest.mark.parametrize("virtual", [True, False])
def test_collective_reduces_in_party_order(virtual):
    log = []
    g = Rendezvous(3, lambda vs: tuple(vs))
    roles = [RoleSpec(f"w{i}", toy_worker(log, f"w{i}", 4, 0.001 * (3 - i), g, i)) for i in range(3)]
    if virtual:
        run_virtual(roles)
    else:
        run_threaded(roles, ThreadGroup("recjax-rt"), emulate_links=False)
    sums = [x[2] for x in log if x[1] == "sum"]
    assert len(sums) == 12 and set(sums) == {(1, 2, 3)}


def shadow(log, pause, group=None):
    while True:
        if group is not None:
            yield Collective(group, 0, 0)
        log.append("sync")
        yield Work(pause=pause)


def paced(comm: float, measured: float | None, steps: int = 2):
    """A role whose steps spend `comm` s outside their compute (a push, a pull) and report
    `measured` s of compute, at straggler factor 5."""
    for _ in range(steps):
        time.sleep(comm)
        yield Work(factor=5.0, measured=measured)


@pytest.mark.parametrize("measured", [0.05, None])
def test_a_straggler_sleeps_factor_minus_one_times_its_measured_compute(measured):
    """Threads sleep (factor - 1) x `Work.measured` (what `Worker.compute` timed), not x the
    role's whole wall time since it resumed, which holds its pushes and pulls too: two steps of
    0.15 s outside compute and 0.05 s of measured compute at factor 5 take 2 x (0.15 + 4 x 0.05)
    = 0.7 s; multiplying the wall (`measured` None, a role without a compute of its own) takes
    2 x 5 x 0.15 = 1.5 s."""
    t0 = time.perf_counter()
    run_threaded([RoleSpec("w", paced(0.15, measured))], ThreadGroup("recjax-rt"),
                 emulate_links=False)
    took = time.perf_counter() - t0
    if measured is None:
        assert 1.45 <= took < 2.2
    else:
        assert 0.68 <= took < 1.2


def test_a_threaded_worker_times_its_compute_only_when_it_straggles():
    """`Worker.compute` blocks on and times its gradients only at factor > 1 (nothing to scale
    at factor 1, and the async dispatch stays as it was): `Work.measured` is then the
    gradient call's time, within the wall time of `compute` (which also pulls the rows)."""
    from algorithms.runtime.engine import Runtime

    cfg = small_cfg("async", trainers=2, workers_per_trainer=1, stragglers="slow:k=1,factor=3")
    rt = Runtime(cfg, 2)
    try:
        item, params = (0, rt.warm_batch), rt.init_state.params
        for wid in range(2):
            worker = rt.placement.worker(wid, None)
            t0 = time.perf_counter()
            _, pending, work = worker.compute(params, item, 0)
            took = time.perf_counter() - t0
            worker.push(pending)
            if rt.stragglers.factor(wid, 0) > 1:
                assert work.factor == 3 and 0 < work.measured <= took
            else:
                assert work.factor == 1 and work.measured is None
    finally:
        rt.close()


def test_100_start_stop_cycles_no_hang_no_leak():
    before = threading.active_count()
    t0 = time.monotonic()
    for cycle in range(100):
        log = []
        g = Rendezvous(2, sum)
        roles = [RoleSpec("w0", toy_worker(log, "w0", 3, 0.0, g, 0)),
                 RoleSpec("w1", toy_worker(log, "w1", 3 + cycle % 2, 0.0, g, 1)),  # a peer leaves
                 RoleSpec("shadow", shadow(log, 0.001), foreground=False)]
        if cycle % 3 == 2:  # a role fails mid-run
            roles.append(RoleSpec("bad", bad_role()))
        try:
            run_threaded(roles, ThreadGroup("recjax-rt"), emulate_links=False)
        except ValueError:
            assert cycle % 3 == 2
        assert runtime_threads() == []
    assert threading.active_count() == before
    assert time.monotonic() - t0 < 30


def test_stragglers_are_seeded_and_parsed():
    m = stragglers.parse("lognormal:sigma=0.5+slow:k=1,factor=4", 4, seed=0)
    f = [[m.factor(w, i) for i in range(50)] for w in range(4)]
    assert f == [[m.factor(w, i) for i in range(50)] for w in range(4)]
    other = stragglers.parse("lognormal:sigma=0.5+slow:k=1,factor=4", 4, seed=1)
    assert f != [[other.factor(w, i) for i in range(50)] for w in range(4)]
    shift = stragglers.parse("shift:k=1,factor=3,period=10", 4, seed=0)
    slow = [[w for w in range(4) if shift.factor(w, i) == 3.0] for i in range(0, 100, 10)]
    assert all(len(s) == 1 for s in slow) and len({s[0] for s in slow}) > 1  # time-varying
    assert stragglers.parse("none", 2, 0).factor(1, 5) == 1.0
    for bad in ("gamma:k=1", "slow:q=1", "slow:k=x"):
        with pytest.raises(ValueError, match="stragglers"):
            stragglers.parse(bad, 2, 0)


def fail_on(monkeypatch, cls, method, after, exc):
    orig, calls, when = getattr(cls, method), [0], {}

    def patched(self, *a, **k):
        calls[0] += 1
        if calls[0] == after:
            when["t"] = time.monotonic()
            raise exc
        return orig(self, *a, **k)

    monkeypatch.setattr(cls, method, patched)
    return when


@pytest.mark.parametrize("algo", ["shadow", "fr"])
def test_worker_exception_ends_run_within_5s(monkeypatch, algo):
    cfg = small_cfg(algo, steps=4000, sync="ma", sync_gap=2, trainers=2, workers_per_trainer=2,
                    train={"deterministic": False})
    when = fail_on(monkeypatch, Worker, "push", 30, RuntimeError("worker 3 lost its GPU"))
    with pytest.raises(RuntimeError, match="lost its GPU") as e:
        shadowsync.run(cfg)
    assert time.monotonic() - when["t"] < 5.0
    assert "patched" in [f.name for f in traceback.extract_tb(e.value.__traceback__)]


def test_failing_ps_shard_stops_run_and_keeps_checkpoint(monkeypatch, tmp_path):
    kw = dict(sync="easgd", trainers=2, workers_per_trainer=1)
    first = shadowsync.run(small_cfg("shadow", steps=8, train={"out": str(tmp_path)}, **kw))
    when = fail_on(monkeypatch, EmbeddingShard, "push", 10, OSError("shard 1 unreachable"))
    cfg = small_cfg("shadow", steps=4000, train={"out": str(tmp_path), "deterministic": False,
                                                 "resume": True}, **kw)
    with pytest.raises(OSError, match="unreachable"):
        shadowsync.run(cfg)
    assert time.monotonic() - when["t"] < 5.0
    state, _ = Checkpointer(str(tmp_path / "checkpoints")).restore(first["final_state"])
    assert int(state.step) == 8


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_threads_and_checkpoints(monkeypatch, tmp_path, sig):
    """Ctrl-C (SIGINT) and a scheduler's SIGTERM both stop every role and leave a checkpoint.
    Before, SIGTERM killed the run with nothing saved, and a SIGINT that arrived while the main
    thread ran a C-invoked callback (JAX's GC hook) was swallowed: the run went on."""
    orig, calls = Worker.push, [0]

    def push(self, pending):
        calls[0] += 1
        if calls[0] == 20:
            if sig == "SIGINT":
                _thread.interrupt_main()  # what Ctrl-C does
            else:
                os.kill(os.getpid(), signal.SIGTERM)
        return orig(self, pending)

    monkeypatch.setattr(Worker, "push", push)
    cfg = small_cfg("shadow", steps=4000, sync="easgd", trainers=2, workers_per_trainer=2,
                    train={"out": str(tmp_path), "deterministic": False})
    with pytest.raises(KeyboardInterrupt):
        shadowsync.run(cfg)
    ck = Checkpointer(str(tmp_path / "checkpoints"))
    assert ck.latest_step() >= 20
    ck.close()


def test_engine_keeps_no_second_copy_of_the_tables():
    """The embedding PS owns the tables once the engine is set up: no live JAX array of a
    table's shape is left (the engine's initial state held all of them, a second copy of
    every table on the host, 1.1 GB of dlrm_kaggle's 3.2 GB)."""
    import gc

    import jax

    from algorithms.runtime.engine import Runtime

    rt = Runtime(small_cfg("async", trainers=2, workers_per_trainer=1), 2)
    try:
        gc.collect()
        shapes = {(t.num_embeddings, t.embedding_dim) for t in rt.model.layout.tables}
        assert not [a.shape for a in jax.live_arrays() if a.shape in shapes]
        assert rt.ps.snapshot()[0].keys() == {t.name for t in rt.model.layout.tables}
    finally:
        rt.close()


def test_a_state_without_tables_restores_a_checkpoint_with_them(tmp_path):
    """`build(..., tables=False)` (the Ray driver's state: its shards draw the tables) has the
    shapes and dtypes of the full state, the same dense params, and is the template a resume
    restores a checkpoint into: the restored tables are the saved ones, to the bit."""
    import jax

    from recjax.data.synthetic import SyntheticSource
    from recjax.train.setup import build

    cfg = small_cfg("async", sparse=("adagrad", 0.05))
    spec = SyntheticSource(cfg.synthetic).spec
    *_, full = build(cfg, spec)
    *_, bare = build(cfg, spec, tables=False)
    assert all(isinstance(x, jax.ShapeDtypeStruct)
               for x in jax.tree.leaves((bare.tables, bare.slots)))
    assert jax.tree.structure(bare) == jax.tree.structure(full)
    assert ([(x.shape, x.dtype) for x in jax.tree.leaves(bare)]
            == [(x.shape, x.dtype) for x in jax.tree.leaves(full)])
    assert_trees(bare.params, full.params, rtol=0, atol=0)
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    try:
        ckpt.save(3, full, {})
        got, _ = ckpt.restore(bare)
    finally:
        ckpt.close()
    assert_trees((got.tables, got.slots), (full.tables, full.slots), rtol=0, atol=0)


def test_a_signal_while_the_roles_start_stops_them_cleanly(monkeypatch):
    """SIGTERM between two threads' starts (a role made 20 pushes before the last thread was
    spawned, under load): the run stops as on any signal (KeyboardInterrupt, the started roles
    ended, no more started), where `ThreadGroup.spawn` used to raise 'thread group is
    stopped'."""
    closed, ran = [], []

    def role(i):
        ran.append(i)
        try:
            while True:
                yield Work(seconds=0.0, pause=0.01)
        finally:
            closed.append(i)

    group = ThreadGroup("t")
    spawn = group.spawn

    def spawn_then_signal(*a, **k):
        t = spawn(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)  # after the first start, before the others
        return t

    monkeypatch.setattr(group, "spawn", spawn_then_signal)
    with pytest.raises(KeyboardInterrupt):
        run_threaded([RoleSpec(f"r{i}", role(i)) for i in range(4)], group)
    assert ran == closed == [0]  # the one started ended; the others never started
