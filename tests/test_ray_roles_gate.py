"""The chunk gate of roles run in their Ray worker actors (algorithms/runtime/ray_roles.py,
``--ray.roles actors``), without Ray: a role on a thread of its own takes batches through
`_Gate.enter`; the driver's `_Gate.chunk` lets it take exactly the batches (or the seconds) it
allows and returns only where the role waits for its next batch, after its previous step's
work, so that the state is whole between chunks; and `RoleServer._drive` runs a role's `Work`
as the threaded interpreter does (a straggler's push after its slowdown, a stop at once).
"""

import threading
import time

import pytest

from algorithms.runtime.ray_roles import _Gate

pytest.importorskip("ray")  # ray_roles imports the Ray backend's modules (Ray itself lazily)


def _role(gate: _Gate, log: list, steps: int, step_s: float = 0.0):
    """A role of `steps` steps: enter, then "work" (logged at its end)."""
    def run():
        for i in range(steps):
            if not gate.enter():
                log.append(("stopped", i))
                gate.end()
                return
            time.sleep(step_s)
            log.append(("done", i))
        gate.end()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_chunk_of_n_lets_exactly_n_steps_finish_and_returns_at_the_next_take():
    gate, log = _Gate(), []
    t = _role(gate, log, steps=10)
    time.sleep(0.05)
    assert log == []  # nothing runs before a chunk allows it
    gate.chunk(3, seconds=60)
    assert log == [("done", 0), ("done", 1), ("done", 2)] and gate.waiting and not gate.done
    gate.chunk(4, seconds=60)
    assert [i for _, i in log] == list(range(7)) and gate.taken == 7
    gate.chunk(100, seconds=60)  # more than is left: returns when the role ended
    assert [i for _, i in log] == list(range(10)) and gate.done and gate.error is None
    t.join(5)


def test_a_chunk_ends_after_its_seconds_at_a_step_boundary():
    gate, log = _Gate(), []
    t = _role(gate, log, steps=1000, step_s=0.01)
    t0 = time.monotonic()
    driver = threading.Thread(target=gate.chunk, args=(1 << 30, 0.2), daemon=True)
    driver.start()
    driver.join(5)
    assert not driver.is_alive(), "the chunk did not end after its seconds"
    took = time.monotonic() - t0
    n = len(log)
    assert 0.2 <= took < 1.0 and 5 <= n <= 25, (took, n)
    assert gate.waiting and gate.taken == n  # at a take, with every taken step finished
    time.sleep(0.1)
    assert len(log) == n  # and it stays there between chunks
    gate.stop()
    t.join(5)
    assert log[-1] == ("stopped", n)


def test_a_stop_ends_the_role_where_it_waits():
    gate, log = _Gate(), []
    t = _role(gate, log, steps=10)
    gate.chunk(2, seconds=60)
    gate.stop()
    t.join(5)
    assert not t.is_alive() and log == [("done", 0), ("done", 1), ("stopped", 2)]


def _server():
    """A `RoleServer` with only what `_drive` uses (no model, no Ray)."""
    from algorithms.runtime.ray_roles import RoleServer, _Slot

    s = object.__new__(RoleServer)
    s.slot = _Slot(1)  # one role; its gate and counters as `s.gate`, `s.delta` here
    s.gate, s.delta = s.slot.gate, s.slot.delta
    return s


def test_a_chunk_ends_while_the_role_waits_on_a_wait_and_no_batch_is_taken_after_it():
    """GBA's gate (a `Wait` before each take) in an actor: `_drive` parks the role there; a
    chunk whose seconds run out while it is parked ends (the state is whole: its previous
    push landed), and once the condition holds the role still takes no batch until the next
    chunk allows one; a chunk whose batches are used up ends at the next Wait; a stop ends
    a Wait at once."""
    from algorithms.runtime.clock import Signal, Wait, Work

    sig, level, log = Signal("ps0"), [0], []
    s = _server()

    def role():
        for i in range(3):
            yield Wait(sig, lambda i=i: level[0] > i)
            if not s.gate.enter():
                return
            log.append(i)
            yield Work()

    def chunk(n, seconds):  # the driver's call, which must come back
        c = threading.Thread(target=s.gate.chunk, args=(n, seconds), daemon=True)
        c.start()
        c.join(5)
        assert not c.is_alive(), "the chunk did not end"

    t = threading.Thread(target=s._drive, args=(role(), s.slot, False), daemon=True)
    t.start()
    t0 = time.monotonic()
    chunk(10, 0.2)
    assert 0.2 <= time.monotonic() - t0 < 1.5 and s.gate.parked and log == []
    level[0] = 1
    sig.notify()
    time.sleep(0.2)
    assert log == [] and s.gate.waiting and not s.gate.parked  # out of the Wait, at the take
    t0 = time.monotonic()
    chunk(1, 60)
    assert time.monotonic() - t0 < 1.5 and log == [0] and s.gate.parked  # at the next Wait
    s.gate.stop()
    t.join(5)
    assert not t.is_alive() and s.gate.done and s.gate.error is None and log == [0]


def test_a_chunk_ends_while_the_role_waits_in_a_collective_and_it_applies_the_result_in_one():
    """ShadowSync's MA / BMUF in a trainer's actor: `_drive` parks the role in a `Collective`
    (the group hosted elsewhere; here a `Rendezvous` of this process). A chunk whose seconds
    run out while it waits for its peers ends there; when the last peer joins between two
    chunks the role gets the result but applies it only in the next chunk (the state the
    driver reads between chunks, for an eval or a checkpoint, does not change under it); a
    chunk whose batches are used up does not end in the Collective (the sync is part of the
    last batch's iteration) but at the next take, or at its seconds; the reduction comes back
    as the role's value; a closed group ends the role, as in a thread."""
    from algorithms.runtime.clock import Collective, Rendezvous, Work

    group, log = Rendezvous(2, sum), []
    s = _server()

    def role():
        for i in range(3):
            if not s.gate.enter():
                return
            log.append(("step", i))
            yield Work()
            got = yield Collective(group, 0, 10 * (i + 1))
            log.append(("applied", got))

    def chunk(n, seconds):  # the driver's call, which must come back
        t0 = time.monotonic()
        c = threading.Thread(target=s.gate.chunk, args=(n, seconds), daemon=True)
        c.start()
        c.join(5)
        assert not c.is_alive(), "the chunk did not end"
        return time.monotonic() - t0

    def peer(value, after=0.0):  # the other party, from another thread
        def run():
            time.sleep(after)
            group.join(1, value, threading.Event()) if value else group.close()
        p = threading.Thread(target=run, daemon=True)
        p.start()
        return p

    t = threading.Thread(target=s._drive, args=(role(), s.slot, False), daemon=True)
    t.start()
    assert 0.2 <= chunk(10, 0.2) < 1.5  # its seconds spent in the Collective
    assert s.gate.parked and log == [("step", 0)]
    peer(1).join(5)  # the last party joins between two chunks
    time.sleep(0.2)
    assert log == [("step", 0)] and not s.gate.parked  # the result waits for a chunk
    assert 0.3 <= chunk(1, 0.3) < 1.5  # used up, parked in the next sync: to its seconds
    assert log == [("step", 0), ("applied", 11), ("step", 1)] and s.gate.parked
    t_peer = time.monotonic()  # the peer's 0.2 s count from here, before the chunk's own clock
    p = peer(2, after=0.2)
    assert chunk(0, 60) < 1.5  # nothing more to take: it ends at the next take, after the peer
    assert time.monotonic() - t_peer >= 0.2
    p.join(5)
    assert log[3:] == [("applied", 22)] and s.gate.waiting
    p = peer(None, after=0.2)  # a party leaves: the group closes
    assert chunk(1, 60) < 1.5
    p.join(5)
    t.join(5)
    assert not t.is_alive() and s.gate.done and s.gate.error is None
    assert log[4:] == [("step", 2)]


def test_a_straggler_pushes_after_its_slowdown_and_a_stop_cuts_the_sleep_short():
    """`RoleServer._drive` runs a role's `Work` as the threaded interpreter does: a step of
    factor F sleeps (F - 1) x its measured compute before the role resumes (and pushes);
    the links' bytes are counted; a stop ends the sleep at once."""
    from algorithms.runtime.clock import Link, Work

    link, log = Link("emb-ps-0", float("inf")), []

    def role():
        for i in range(3):
            log.append(("computed", i, time.monotonic()))
            yield Work(factor=3.0, measured=0.05, transfers=((link, 100),))
            log.append(("pushed", i, time.monotonic()))

    s = _server()
    t = threading.Thread(target=s._drive, args=(role(), s.slot, False), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and s.gate.done and s.gate.error is None
    for i in range(3):
        (_, _, c), (_, _, p) = log[2 * i], log[2 * i + 1]
        assert 0.1 <= p - c < 0.5, (i, p - c)  # (3 - 1) x 0.05 s
    assert s.delta.d["link_bytes"]["emb-ps-0"] == 300

    s, log = _server(), []

    def slow():
        log.append("computed")
        yield Work(factor=1001.0, measured=0.05)  # 50 s
        log.append("pushed")

    t = threading.Thread(target=s._drive, args=(slow(), s.slot, False), daemon=True)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.2)
    s.gate.stop()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 2 and log == ["computed"]


def test_the_role_threads_first_gradient_computation_is_a_warm_up_not_a_timed_step():
    """The first execution on the role's thread took 83-118 ms in some runs where later ones
    take 2-3 ms (a one-off of the process, not a retrace), and a straggler of factor 50 would
    sleep 49x that: `RoleWorker.compute` runs it once untimed, then the step it times. Later
    steps run it once. The timed seconds travel in the step's `Work` (recorded for the driver
    where the role runs, `RoleServer._drive`, as every role's timed compute), not here."""
    import types

    from algorithms.runtime import stragglers
    from algorithms.runtime.ray_role_worker import RoleWorker

    s, calls = _server(), []
    secs = iter([0.118, 0.002, 0.003, 0.0025])

    def compute(params, local, coalesce, *minis):
        calls.append(params)
        return ({"n": 1.0}, next(secs)), {"w": params}

    s.compute, s.batch_size = compute, 4
    w = RoleWorker(s, s.slot, 0, supply=None, shards=[(None, [], 0)],
                   draws=stragglers.parse("slow:k=1,factor=50", 1, 0), example_cost=0.0, dims={})
    measured = []
    for it in range(3):
        g, pending, work = w.compute(it, (it, (types.SimpleNamespace(), {})), it)
        assert g == {"w": it} and work.factor == 50.0
        measured.append(work.measured)
    assert calls == [0, 0, 1, 2]  # two executions for the first step, one after it
    assert measured == [0.002, 0.003, 0.0025]
    assert s.delta.d["measured"] == [] and len(s.delta.d["metrics"]) == 3


def test_a_role_without_batches_passes_the_gate_before_each_step():
    """ShadowSync's shadow in its trainer's actor takes no batch: `_drive` passes the gate
    before each of its steps (each `send`), so a chunk of n lets exactly n steps run, starting
    none before the first chunk, and a chunk ends between two steps (its sync landed)."""
    from algorithms.runtime.clock import Work

    log = []

    def shadow():
        i = 0
        while True:
            log.append(("sync", i))
            yield Work(pause=0.0)
            i += 1

    s = _server()
    t = threading.Thread(target=s._drive, args=(shadow(), s.slot, True), daemon=True)
    t.start()
    time.sleep(0.1)
    assert log == []  # nothing before a chunk allows it
    s.gate.chunk(3, seconds=60)
    assert log == [("sync", 0), ("sync", 1), ("sync", 2)] and s.gate.waiting
    s.gate.chunk(2, seconds=60)
    assert [i for _, i in log] == [0, 1, 2, 3, 4]
    s.gate.stop()
    t.join(5)
    assert not t.is_alive() and s.gate.done and s.gate.error is None and len(log) == 5
