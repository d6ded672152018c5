"""Every --algo reports the same way (issue 15): metrics.jsonl record kinds, TensorBoard tags,
a train-NE curve that adds up, mid-run evals; on the virtual clock evals change nothing."""

import dataclasses
import json
import struct

import jax
import numpy as np
import pytest

import algorithms
from recjax import metrics
from recjax.models.config import ModelConfig
from tests.runtime_util import assert_trees, small_cfg

STEPS, LOG, EVAL, B = 12, 4, 8, 64

# per algorithm: its config fields, and one counter it must record over time
ALGOS = {
    "single": ({}, None),
    "sync": ({"train": {"devices": 2}}, "counters/comm_bytes_per_step"),
    "des": ({"train": {"devices": 2}, "model": "deepfm"}, "counters/comm_bytes_per_step"),
    "async": ({"trainers": 2, "workers_per_trainer": 2}, "counters/mean_staleness"),
    "shadow": ({"trainers": 2, "workers_per_trainer": 2}, "counters/avg_sync_gap"),
    "gba": ({"workers": 4, "local_batch_size": 16}, "counters/dropped"),
    "persia": ({}, "counters/embedding_staleness.mean"),
}
CORE_TAGS = {"train/loss", "train/train_ne", "train/train_ne_window", "eval/auc", "eval/ne",
             "eval/logloss", "eval/calibration"}


def _cfg(algo, out, **train):
    fields, _ = ALGOS[algo]
    fields = dict(fields)
    t = {"out": str(out), "log_every": LOG, "eval_every": EVAL, "tensorboard": True,
         **fields.pop("train", {}), **train}
    model = fields.pop("model", None)
    cfg = small_cfg(algo, steps=STEPS, train=t, **fields)
    return dataclasses.replace(cfg, model=ModelConfig.smoke(model)) if model else cfg


def _records(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _windows(out):
    """``([0, record steps...], [seconds of each train record's window])``, the seconds from
    each record's rate."""
    train = [r for r in _records(out) if r["kind"] == "train"]
    steps = [0] + [r["step"] for r in train]
    return steps, [(b - a) * B / r["examples_per_sec"] for a, b, r in zip(steps, steps[1:], train)]


def _tb_tags(out):
    """The scalar tags in out/tb, read from the TFRecord framing (TensorBoard not needed)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for f in (out / "tb").iterdir():
        data = f.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            tags |= {v.tag for v in ev.summary.value}
    return tags


@pytest.mark.parametrize("algo", list(ALGOS))
def test_every_algo_writes_the_same_kinds_of_records(tmp_path, algo):
    s = algorithms.run(_cfg(algo, tmp_path))
    recs = _records(tmp_path)
    kinds = {r["kind"] for r in recs}
    host_async = algo not in ("single", "sync", "des")
    assert kinds == {"train", "eval"} | ({"counters"} if algo != "single" else set())
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12]
    assert [r["step"] for r in recs if r["kind"] == "eval"] == [8, 12]
    rate = "examples_per_virtual_sec" if host_async else "examples_per_sec"
    assert all(r[rate] > 0 for r in train)

    # the curve, rebuilt with numpy from the logged window sums (ShadowSync Eq. 2)
    ll = np.cumsum([r["window_logloss_sum"] for r in train])
    n = np.cumsum([r["window_count"] for r in train])
    clicks = np.cumsum([r["window_label_sum"] for r in train])
    ctr = clicks / n
    h = -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))
    np.testing.assert_allclose([r["train_ne"] for r in train], ll / n / h, rtol=1e-9)
    assert n[-1] == STEPS * B  # every batch of the run scored once
    assert train[-1]["train_ne"] == pytest.approx(s["train_ne"], rel=1e-12)
    final_eval = [r for r in recs if r["kind"] == "eval"][-1]
    assert final_eval["ne"] == pytest.approx(s["eval_ne"], rel=1e-12)
    assert h[-1] == pytest.approx(metrics.binary_entropy(ctr[-1]), rel=1e-12)

    tags = _tb_tags(tmp_path)
    assert CORE_TAGS | {f"train/{rate}"} <= tags, CORE_TAGS - tags
    counter = ALGOS[algo][1]
    if counter is not None:
        assert counter in tags, sorted(t for t in tags if t.startswith("counters/"))
    else:
        assert not any(t.startswith("counters/") for t in tags)


@pytest.mark.parametrize("algo", ["shadow", "gba"])
def test_mid_run_evals_change_nothing_on_the_virtual_clock(tmp_path, algo):
    """An eval reads a snapshot between two events: the trajectory is bit-identical with and
    without evals, and each mid-run eval equals a fresh eval of a run stopped at that step."""
    a = algorithms.run(_cfg(algo, tmp_path / "a"))
    b = algorithms.run(_cfg(algo, tmp_path / "b", eval_every=0))
    assert_trees(a["final_state"], b["final_state"])
    ta = [r for r in _records(tmp_path / "a") if r["kind"] == "train"]
    tb = [r for r in _records(tmp_path / "b") if r["kind"] == "train"]
    assert [r["train_ne"] for r in ta] == [r["train_ne"] for r in tb]
    mid = [r for r in _records(tmp_path / "a") if r["kind"] == "eval" and r["step"] == EVAL][0]
    stopped = algorithms.run(small_cfg(algo, steps=EVAL, train={"out": str(tmp_path / "c")},
                                       **ALGOS[algo][0]))
    if algo == "shadow":  # a static shard split differs by run length: only a sanity bound
        assert abs(mid["ne"] - stopped["eval_ne"]) < 0.05
    else:  # GBA's data list does not depend on the run length: the same model at step 8
        assert mid["ne"] == pytest.approx(stopped["eval_ne"], rel=1e-9)


def test_threaded_run_records_evals_from_a_held_snapshot(tmp_path):
    """Threads: records and evals land at or past each multiple; the roles are held meanwhile
    (the held time is not training time)."""
    cfg = _cfg("async", tmp_path, deterministic=False)
    s = algorithms.run(cfg)
    recs = _records(tmp_path)
    train = [r["step"] for r in recs if r["kind"] == "train"]
    evals = [r["step"] for r in recs if r["kind"] == "eval"]
    assert train[-1] == STEPS and len(train) >= 2 and train == sorted(train)
    assert evals[-1] == STEPS and len(evals) == 2 and EVAL <= evals[0] < STEPS
    assert all("examples_per_sec" in r for r in recs if r["kind"] == "train")
    assert s["clock"] == "wall"
    assert jax.tree.leaves(s["final_state"].params)


def test_the_poll_reads_a_remote_step_once_a_chunk_and_the_hold_reads_it_exactly():
    """Under Ray the step may be a call to another process (GBA's PS0): the poll reads it
    again only once `placement.step_poll_s` passed (it was a call every 50 ms poll, 4-9 ms of
    the driver's CPU a second); in this process every poll reads it."""
    import types

    from algorithms.runtime.report import Reporter

    reads = []

    def step():
        reads.append(len(reads))
        return 10 + len(reads)

    for poll_s, expect in ((0.5, [11, 11, 11, 12, 12, 13]), (0.0, [11, 12, 13, 14, 15, 16])):
        r, reads[:] = object.__new__(Reporter), []
        r.rt = types.SimpleNamespace(placement=types.SimpleNamespace(step_poll_s=poll_s))
        r.step, r._polled = step, (float("-inf"), 10)
        seen = [r._poll_step(t) for t in (100.0, 100.05, 100.45, 100.5, 100.9, 101.2)]
        assert seen == expect and len(reads) == expect[-1] - 10


def test_record_rates_are_over_training_seconds_not_the_set_up(tmp_path, monkeypatch):
    """Threads: a record's rate is its steps' examples over the training seconds since the
    record before; the set-up before the roles start (compiles; Ray's actors: seconds) is in
    none of them. Its origin at the reporter's making put a slow set-up into the first window
    and took it out of the last, whose rate then read 1e15 examples/s (a GBA run on Ray wrote
    2.8e15 at a checkpoint interval's end)."""
    import time

    from algorithms.runtime.placement import InProcess

    setup_s = 2.0
    monkeypatch.setattr(InProcess, "warm", lambda self, *a, **k: time.sleep(setup_s))
    cfg = _cfg("async", tmp_path, deterministic=False, eval_every=0)
    s = algorithms.run(cfg)
    steps, window_s = _windows(tmp_path)
    assert len(window_s) >= 2 and steps[-1] == STEPS
    # each window is positive, and none holds the set-up (the run trains in a fraction of it)
    assert all(0 < w < setup_s for w in window_s), window_s
    assert sum(window_s) == pytest.approx(s["train_seconds"], rel=1e-6)


def test_no_record_passes_the_runs_training_seconds_when_the_main_thread_is_late(
        tmp_path, monkeypatch):
    """Threads: a record's seconds are read where the roles are held, the instant the held
    time counts from, on the clock `Schedule.seconds` counts from. The main thread is
    preempted (here: 0.3 s) after it took that clock's origin and after it held the roles:
    a record read after the delay, or an origin read twice, put the step-8 record past the
    run's training seconds, and the last window read 1e-12 s (CI stop 52, 1 ms under load)."""
    import time

    from algorithms.runtime.report import Reporter

    start, hold = Reporter.start, Reporter._hold_roles

    def late(f):
        def g(self):
            out = f(self)
            time.sleep(0.3)
            return out
        return g

    monkeypatch.setattr(Reporter, "start", late(start))
    monkeypatch.setattr(Reporter, "_hold_roles", late(hold))
    cfg = _cfg("async", tmp_path, deterministic=False, eval_every=0)
    s = algorithms.run(cfg)
    steps, window_s = _windows(tmp_path)
    assert steps[-1] == STEPS and len(window_s) >= 3
    assert all(w > 1e-6 for w in window_s), window_s
    assert sum(window_s) == pytest.approx(s["train_seconds"], rel=1e-6)
