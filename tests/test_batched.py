"""Deferred worker computations, batched on the virtual clock (algorithms/runtime/batched.py).

A toy function whose results are hand-checkable (``p * x``, ``p + x``) shows the mechanics:
calls wait for their first use, then every pending call runs in one dispatch, each on its own
inputs (a call given another call's params fails here). On the real model a batched gradient
is the plain call's bit for bit, whichever calls share its batch, and a whole virtual-clock run
keeps the eager run: the same events in the same order, the same versions read, the same
state.
"""

import jax
import numpy as np
import pytest

from algorithms import gba, shadowsync
from algorithms.runtime import batched
from algorithms.runtime.engine import Runtime
from tests.runtime_util import assert_trees, small_cfg


def toy(p, x):
    return p * x, p + x


TOY = jax.jit(toy)


def test_pending_calls_run_together_at_their_first_use_each_on_its_own_inputs():
    params = [np.float32(2), np.float32(3), np.float32(-1)]  # three versions read
    xs = [np.arange(3, dtype=np.float32) + 10 * i for i in range(3)]  # [0 1 2] [10 11 12] ...
    with batched.batching() as b:
        assert batched.active() is b
        ds = [b.submit(TOY, 4, (p, x)) for p, x in zip(params, xs)]
        assert b.calls == 0 and not any(d.done for d in ds)  # nothing runs at submit
        np.testing.assert_array_equal(ds[1].part(0).get(), [30, 33, 36])  # 3 * [10 11 12]
        assert b.calls == 1 and b.lanes_used == 3 and all(d.done for d in ds)
        np.testing.assert_array_equal(ds[0].part(0).get(), [0, 2, 4])
        np.testing.assert_array_equal(ds[2].part(0).get(), [-20, -21, -22])  # -1 * [20 21 22]
        np.testing.assert_array_equal(ds[2].part(1).get(), [19, 20, 21])  # -1 + [20 21 22]
        assert b.calls == 1  # a done call is not run again
        later = b.submit(TOY, 4, (np.float32(5), xs[0]))
        np.testing.assert_array_equal(batched.resolve(later.part(1)), [5, 6, 7])
        assert b.calls == 2 and b.lanes_used == 4
    assert batched.active() is None


def test_more_calls_than_lanes_run_in_order_and_idle_lanes_leak_nothing():
    got = []
    with batched.batching() as b:
        ds = [b.submit(TOY, 2, (np.float32(i), np.ones(2, np.float32)), on_done=got.append)
              for i in range(5)]
        ds[4].get()
        assert b.calls == 3 and b.lanes_used == 5  # lanes (0 1) (2 3) (4 idle)
    assert [float(g[0][0]) for g in got] == [0, 1, 2, 3, 4]  # on_done in submission order
    assert [float(d.get()[1][1]) for d in ds] == [1, 2, 3, 4, 5]


def test_the_end_of_the_run_computes_every_call_still_pending():
    got = []
    with batched.batching() as b:
        d = b.submit(TOY, 2, (np.float32(7), np.ones(1, np.float32)), on_done=got.append)
    assert d.done and b.calls == 1 and float(got[0][0][0]) == 7  # its metrics are read later


def test_a_function_s_batched_program_is_compiled_once_for_every_run_of_the_clock():
    # each checkpoint interval of a run is a virtual-clock run with a batcher of its own,
    # calling the runtime's one jitted gradient function
    fn = jax.jit(lambda p, x: (p * x, p - x))
    progs = []
    for _ in range(2):
        with batched.batching() as b:
            d = b.submit(fn, 2, (np.float32(3), np.ones(2, np.float32)))
            np.testing.assert_array_equal(d.part(1).get(), [2, 2])
            progs.append(b.program((fn, 2)))
    assert progs[0] is progs[1]
    assert progs[0]._cache_size() == 1  # one compilation for both runs


def test_calls_of_another_function_or_width_are_not_batched_together():
    other = jax.jit(lambda p, x: (p - x, p))
    with batched.batching() as b:
        a = b.submit(TOY, 2, (np.float32(1), np.ones(1, np.float32)))
        c = b.submit(other, 2, (np.float32(1), np.ones(1, np.float32)))
        w = b.submit(TOY, 4, (np.float32(1), np.ones(1, np.float32)))
        a.get()
        assert a.done and not c.done and not w.done


@pytest.fixture(scope="module")
def gba_runtime():
    cfg = small_cfg("gba", steps=4, workers=4, local_batch_size=16)
    rt = Runtime(cfg, 4, batch_size=16)
    supply = rt.shared_list(4)
    items = [supply.take() for _ in range(6)]
    supply.close()
    yield rt, items
    rt.close()


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_a_batched_gradient_is_the_plain_calls_bit_for_bit_in_any_company(gba_runtime):
    """Each call of a batch is computed as the plain jitted call computes it, whichever calls
    (other versions of the params, other batches) share its batch and wherever it sits."""
    rt, items = gba_runtime
    p0 = rt.init_state.params
    p1 = jax.tree.map(lambda x: x * 0.5, p0)  # another version
    calls = [(p0 if i % 2 else p1, rt.ps.pull(it[1][1], admit=False), it[1][0])
             for i, it in enumerate(items)]
    for fn in (rt.grads_rows, rt.grads):
        plain = [_leaves(jax.device_get(fn(*c))) for c in calls]
        with batched.batching() as b:  # one batcher: its program compiles once
            for which in ((0,), (1, 0), (2, 3, 5, 0), (4, 0, 1), (5, 4, 3, 2, 1, 0)):
                ds = [b.submit(fn, 4, calls[i]) for i in which]
                got = [_leaves(d.get()) for d in ds]  # the first get runs this batch
                for i, g in zip(which, got):
                    for x, y in zip(g, plain[i]):
                        np.testing.assert_array_equal(x, y)


def _eager(monkeypatch):
    """Worker computations run when made, as in threads (no batcher is seen)."""
    monkeypatch.setattr(batched, "ENABLED", False)


def _batched_calls(monkeypatch) -> list:
    """Record each batcher's (calls, lanes used) at the end of its run."""
    seen = []
    flush = batched.Batcher.flush

    def counting(self):
        flush(self)
        seen.append((self.calls, self.lanes_used))

    monkeypatch.setattr(batched.Batcher, "flush", counting)
    return seen


def _same_schedule(a: dict, b: dict, keys: tuple) -> None:
    assert a["schedule"].trace == b["schedule"].trace  # the same events in the same order
    assert a["schedule"].seconds == b["schedule"].seconds
    for k in keys:
        assert a[k] == b[k], k
    assert a["eval_auc"] == b["eval_auc"] and a["train_ne"] == b["train_ne"]
    assert_trees(a["final_state"], b["final_state"])  # bit for bit


@pytest.mark.parametrize("mode", ["gba", pytest.param("async", marks=pytest.mark.slow)])
def test_a_batched_gba_run_keeps_the_eager_schedule_and_versions(mode, monkeypatch):
    """Stragglers make the workers read different versions and push out of order; batched,
    the run has the eager run's events, versions read (staleness histograms), drops,
    updates and state, bit for bit."""
    cfg = small_cfg("gba", steps=6, workers=4, local_batch_size=16, mode=mode,
                    stragglers="slow:k=1,factor=3+lognormal:sigma=0.4", iota=1)
    seen = _batched_calls(monkeypatch)
    got = gba.run(cfg)
    assert seen and seen[0][0] < seen[0][1] == got["tokens_handed_out"]  # batches of several
    _eager(monkeypatch)
    want = gba.run(cfg)
    assert want["dense_staleness"]["max"] > 0  # versions really differ within the run
    _same_schedule(got, want, ("dense_staleness", "embedding_staleness", "dropped_gradients",
                               "dropped_embedding_rows", "updates", "gradients_applied"))


def test_a_batched_shadowsync_run_keeps_the_eager_schedule(monkeypatch):
    cfg = small_cfg("fr", steps=24, trainers=4, workers_per_trainer=1, sync="ma", sync_gap=3,
                    stragglers="lognormal:sigma=0.5")
    seen = _batched_calls(monkeypatch)
    got = shadowsync.run(cfg)
    assert seen and seen[0][0] < seen[0][1]
    _eager(monkeypatch)
    want = shadowsync.run(cfg)
    _same_schedule(got, want, ("syncs", "avg_sync_gap", "sync_bytes"))
