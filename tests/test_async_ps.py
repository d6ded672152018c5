"""Async PS (Downpour/Hogwild): one worker is exactly single-process training."""

import numpy as np
import pytest

from algorithms import async_ps
from tests.runtime_util import assert_trees, reference, small_cfg, worker_batches


@pytest.mark.parametrize("dense,sparse,deterministic", [
    (("sgd", 0.1), ("sgd", 0.05), True),
    (("sgd", 0.1), ("sgd", 0.05), False),  # one thread: as deterministic as the virtual clock
    (("adam", 0.01), ("adagrad", 0.05), True),
])
def test_one_worker_equals_train_step(dense, sparse, deterministic):
    cfg = small_cfg("async", steps=12, dense=dense, sparse=sparse, trainers=1,
                    workers_per_trainer=1, train={"deterministic": deterministic})
    got = async_ps.run(cfg)["final_state"]
    want = reference(cfg, worker_batches(cfg, 0, 1, 12))
    assert int(got.step) == 12
    # SGD: a simple op per step (1e-5). Adagrad merges duplicate ids of a batch in another
    # order on the mini table than on the full one; over 12 Adam+Adagrad steps that is a
    # composite (1e-4, STYLE.md rule 6).
    tol = 1e-5 if sparse[0] == "sgd" else 1e-4
    assert_trees(got.params, want.params, rtol=tol, atol=1e-7)
    assert_trees(got.tables, want.tables, rtol=tol, atol=1e-7)
    assert_trees(got.slots, want.slots, rtol=tol, atol=1e-7)


def test_many_workers_report_staleness():
    cfg = small_cfg("async", steps=24, trainers=2, workers_per_trainer=2,
                    stragglers="lognormal:sigma=0.5")
    s = async_ps.run(cfg)
    assert s["steps"] == 24 and s["clock"] == "virtual"
    hist = {int(k): v for k, v in s["staleness_histogram"].items()}
    assert sum(hist.values()) == 24 and max(hist) >= 1  # 4 workers: gradients are stale
    assert np.isfinite(s["eval_ne"]) and s["embedding_bytes"] > 0


def test_resume_continues_each_workers_data(tmp_path):
    """Stop after 6 of 12 steps, resume: the same parameters as 12 steps in one go.

    One worker makes async PS a sequential SGD, so the two trajectories must agree; a resumed
    run that restarted its data shard (or ran the full quota again) would not.
    """
    straight = async_ps.run(small_cfg("async", steps=12, trainers=1, workers_per_trainer=1))
    out = {"out": str(tmp_path)}
    async_ps.run(small_cfg("async", steps=6, trainers=1, workers_per_trainer=1, train=out))
    resumed = async_ps.run(small_cfg("async", steps=12, trainers=1, workers_per_trainer=1,
                                     train={**out, "resume": True}))
    assert resumed["steps"] == 12 and resumed["resumed_from_step"] == 6
    assert_trees(resumed["final_state"].params, straight["final_state"].params, rtol=1e-6, atol=1e-8)
    assert_trees(resumed["final_state"].tables, straight["final_state"].tables, rtol=1e-6, atol=1e-8)
    # a resume at the run's end trains nothing (tests/test_intervals.py: it only evaluates)
    end = async_ps.run(small_cfg("async", steps=12, trainers=1, workers_per_trainer=1,
                                 train={**out, "resume": True}))
    assert end["worker_iterations"] == 0 and end["eval_ne"] == resumed["eval_ne"]
    assert_trees(end["final_state"].params, resumed["final_state"].params)


def test_run_ends_at_exactly_the_requested_step():
    """10 steps over 4 workers: two workers take 3 batches, two take 2 (the old equal quotas
    of 10 // 4 ended the run at step 8, and a resumed run came up short the same way)."""
    s = async_ps.run(small_cfg("async", steps=10, trainers=2, workers_per_trainer=2))
    assert s["steps"] == 10 and s["worker_iterations"] == 10
    assert sum(int(v) for v in s["staleness_histogram"].values()) == 10
