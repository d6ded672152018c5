"""Persia (algorithms/persia.py): the limits of the hybrid algorithm, its counters, recovery.

References are independent of the code under test: the single-device trainer (`loop.run`) for
``tau = 0``, the staleness bound of Eq. 5 checked on the recorded histogram, and bitwise
equality of two schedules that must coincide (a failure at a snapshot point loses nothing).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from algorithms import persia, persia_roles
from recjax.train import loop
from tests.runtime_util import small_cfg


def _cfg(steps=16, sparse=("sgd", 0.05), dense=("sgd", 0.1), train=None, **persia_fields):
    cfg = small_cfg("persia", steps=steps, sparse=sparse, dense=dense, train=train)
    return dataclasses.replace(cfg, persia=dataclasses.replace(cfg.persia, **persia_fields))


def _single(cfg):
    return loop.run(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, algo="single")))


def _max_diff(a, b) -> float:
    pairs = list(zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
    pairs += [(a.tables[k], b.tables[k]) for k in a.tables]
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs)


def _bitwise(a, b) -> bool:
    return _max_diff(a, b) == 0.0


@pytest.mark.parametrize("sparse,dense,workers", [
    (("sgd", 0.05), ("sgd", 0.1), (2, 2)),
    (("adagrad", 0.05), ("adam", 0.01), (2, 3)),
    (("adam", 0.01), ("sgd", 0.1), (4, 1)),
])
def test_tau_zero_is_synchronous_training_on_the_global_batch(sparse, dense, workers):
    """tau = 0: every lookup sees every earlier update, the K slices' dense gradients are
    averaged: the single-device trainer on the same global batch, to float rounding."""
    k, e = workers
    cfg = _cfg(sparse=sparse, dense=dense, staleness=0, nn_workers=k, embedding_workers=e)
    got = persia.run(cfg)
    ref = _single(cfg)
    assert _max_diff(got["final_state"], ref["final_state"]) <= 1e-5
    assert got["embedding_staleness"]["max"] == 0
    assert got["embedding_updates"] == 16
    assert abs(got["train_ne"] - ref["train_ne"]) <= 1e-5


def test_sync_mode_forces_tau_zero():
    cfg = _cfg(mode="sync", staleness=5)
    got = persia.run(cfg)
    assert got["persia_staleness_bound"] == 0
    assert _max_diff(got["final_state"], _single(cfg)["final_state"]) <= 1e-5


@pytest.mark.parametrize("tau,emb_workers", [(1, 1), (3, 2), (6, 4)])
def test_staleness_is_bounded_by_tau_and_reached(tau, emb_workers):
    """Eq. 5 (t - D(t) <= tau) on every update; with fast embedding workers the pipeline
    fills, so the bound is reached (the permits are really used)."""
    cfg = _cfg(steps=24, staleness=tau, embedding_workers=emb_workers)
    got = persia.run(cfg)
    hist = {int(k): v for k, v in got["embedding_staleness"]["histogram"].items()}
    assert sum(hist.values()) == 24
    assert max(hist) == tau
    # and it changes the result: stale lookups are not the synchronous run
    assert _max_diff(got["final_state"], _single(cfg)["final_state"]) > 1e-6


def test_staleness_bound_holds_in_threads():
    cfg = _cfg(steps=24, staleness=2, embedding_workers=3, train={"deterministic": False})
    got = persia.run(cfg)
    assert got["embedding_staleness"]["max"] <= 2
    assert got["embedding_updates"] == 24 and got["steps"] == 24


def test_deterministic_mode_is_bit_reproducible():
    cfg = _cfg(staleness=3, compress="both")
    a, b = persia.run(cfg), persia.run(cfg)
    assert _bitwise(a["final_state"], b["final_state"])
    assert a["embedding_staleness"] == b["embedding_staleness"]


def test_compression_none_is_bit_identical_to_no_codec(monkeypatch):
    cfg = _cfg(staleness=2, compress="none")
    with_codec = persia.run(cfg)

    class NoCodec:
        kind = "none"

        def send_ids(self, ids):
            return ids, ids.nbytes, ids.nbytes

        def send_values(self, x):
            return x, x.nbytes, x.nbytes

        def recv_ids(self, m):
            return m

        def recv_values(self, m):
            return m

    monkeypatch.setattr(persia, "Codec", lambda kind, kappa: NoCodec())
    without = persia.run(cfg)
    assert _bitwise(with_codec["final_state"], without["final_state"])


def test_compression_shrinks_the_bytes_and_barely_changes_training():
    base = persia.run(_cfg(steps=32, staleness=2))
    both = persia.run(_cfg(steps=32, staleness=2, compress="both"))
    for pair in ("embedding->nn", "nn->embedding"):
        raw, sent = both["bytes"][pair]["raw"], both["bytes"][pair]["sent"]
        assert raw == base["bytes"][pair]["raw"] == base["bytes"][pair]["sent"]
        d = 8  # the smoke DLRM's embedding dim: a block is 8 f32 (32 B) sent as 8 f16 + one f32
        assert sent * (4 * d) == raw * (2 * d + 4)
    # int32 bucket ids gain nothing from unique int64 + 2 x uint16 (raw 64-bit ids do:
    # tests/test_lru_engine.py); the ledger says so rather than hiding it
    ids = both["bytes"]["loader->embedding"]
    assert ids["raw"] == 32 * 64 * 4 * 4  # steps x rows x 4 smoke fields x int32
    assert ids["sent"] > ids["raw"]
    assert not _bitwise(base["final_state"], both["final_state"])  # lossy: really applied
    assert _max_diff(base["final_state"], both["final_state"]) < 1e-2
    assert abs(base["eval_auc"] - both["eval_auc"]) < 0.01


def test_lossless_id_compression_trains_bit_identically():
    base = persia.run(_cfg(steps=12, staleness=2))
    ids = persia.run(_cfg(steps=12, staleness=2, compress="ids"))
    assert _bitwise(base["final_state"], ids["final_state"])
    assert ids["bytes"]["loader->embedding"]["sent"] != ids["bytes"]["loader->embedding"]["raw"]


def test_async_mode_has_dense_staleness_and_no_allreduce(monkeypatch):
    built = []  # the NN workers' replica and all-reduce: async mode steps the dense PS instead
    real = persia.DenseGroup.__init__
    monkeypatch.setattr(persia.DenseGroup, "__init__",
                        lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    got = persia.run(_cfg(steps=24, mode="async", staleness=2, nn_workers=4))
    assert built == []  # none built (under --ray.dense_shards D it was D idle actors)
    assert got["nn_recoveries"] == 0 and got["dense_steps_lost"] == 0
    assert got["dense_allreduce_seconds"] == 0.0
    assert "nn<->nn (all-reduce)" not in got["bytes"]
    assert got["dense_staleness"]["max"] >= 1
    assert np.isfinite(got["eval_ne"])


def test_ps_failure_at_a_snapshot_loses_nothing():
    """Shard 0 is wiped (NaN) right after its snapshot and restored from it: with tau = 0
    nothing was in flight, so the run is the fault-free one, bit for bit."""
    clean = persia.run(_cfg(staleness=0, snapshot_every=4))
    hit = persia.run(_cfg(staleness=0, snapshot_every=4, fail_ps_at=8))
    assert hit["ps_recoveries"] == 1 and hit["ps_updates_lost"] == 0
    assert _bitwise(clean["final_state"], hit["final_state"])


def test_ps_failure_between_snapshots_loses_the_updates_since():
    clean = persia.run(_cfg(staleness=2, snapshot_every=5))
    hit = persia.run(_cfg(staleness=2, snapshot_every=5, fail_ps_at=8))
    assert hit["ps_recoveries"] == 1 and hit["ps_updates_lost"] == 3
    assert not _bitwise(clean["final_state"], hit["final_state"])
    assert np.isfinite(hit["eval_ne"]) and np.isfinite(hit["train_ne"])
    for t in hit["final_state"].tables.values():
        assert np.isfinite(np.asarray(t)).all()


def test_nn_failure_reloads_the_last_dense_snapshot_on_every_worker():
    clean = persia.run(_cfg(staleness=0, snapshot_every=4, nn_workers=4))
    hit = persia.run(_cfg(staleness=0, snapshot_every=4, nn_workers=4, fail_nn_at=7))
    # step 7 fails: the dense model goes back to step 4; steps 5-6 and 7's gradient are lost
    assert hit["nn_recoveries"] == 1 and hit["dense_steps_lost"] == 2
    assert not _bitwise(clean["final_state"], hit["final_state"])
    assert np.isfinite(hit["eval_ne"])


def test_nn_failure_right_after_a_snapshot_loses_no_dense_step():
    hit = persia.run(_cfg(staleness=0, snapshot_every=4, fail_nn_at=5))
    assert hit["nn_recoveries"] == 1 and hit["dense_steps_lost"] == 0


def test_bad_sizes_say_what_to_do():
    with pytest.raises(ValueError, match="persia.nn_workers=3"):
        persia.plan(_cfg(nn_workers=3))


def test_an_nn_straggler_sleeps_for_its_timed_forward_backward(monkeypatch):
    """An NN worker's `Work` carries its forward/backward's own time (`LocalFn.timed`) when
    it straggles, so the slowdown scales that, not the codec or the waits around it (under
    Ray: not the activations' round trip); at factor 1 nothing is timed (async dispatch
    kept). The embedding workers' steps keep their wall time (their lookups are their work)."""
    import sys

    from algorithms.runtime import clock

    seen = []

    def spy(*args, **kw):  # each Work with the role that yielded it
        work = clock.Work(*args, **kw)
        seen.append((sys._getframe(1).f_code.co_name, work))
        return work

    monkeypatch.setattr(persia_roles, "Work", spy)
    cfg = _cfg(steps=8, nn_workers=2, embedding_workers=1, staleness=2,
               train={"deterministic": False})
    cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(
        cfg.runtime, stragglers="slow:k=1,factor=3"))
    got = persia.run(cfg)
    assert got["steps"] == 8
    nn = [w for role, w in seen if role == "nn_worker"]
    emb = [w for role, w in seen if role != "nn_worker"]
    assert len(nn) == 16 and emb  # 2 NN workers x 8 steps
    slow = [w for w in nn if w.factor == 3]
    assert len(slow) == 8  # one of the two NN workers straggles, every step
    assert all(w.measured is not None and 0 < w.measured < 5 for w in slow)
    assert all(w.measured is None for w in nn if w.factor == 1)
    assert all(w.measured is None for w in emb)


def test_a_local_fn_times_what_it_returns(monkeypatch):
    """`LocalFn.timed` waits for the computation it times (jax dispatches asynchronously: the
    time to the call's return alone would be the dispatch), and returns its result."""
    from algorithms.runtime import worker

    waited = []
    block = jax.block_until_ready
    monkeypatch.setattr(worker.jax, "block_until_ready", lambda x: waited.append(x) or block(x))
    fn = worker.LocalFn(jax.jit(lambda x: (x @ x).sum()))
    x = np.ones((64, 64), np.float32)
    assert float(fn(x)) == 64.0 ** 3 and waited == []  # a plain call keeps async dispatch
    out, secs = fn.timed(x)
    assert waited == [out] and float(out) == 64.0 ** 3 and secs > 0


def test_every_mode_is_a_row_of_the_rule_table():
    from recjax.config_async import PERSIA_MODES

    assert tuple(persia.MODES) == PERSIA_MODES
