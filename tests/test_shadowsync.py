"""ShadowSync / FR runs on the runtime: limiting cases (STYLE.md rule 7) and determinism."""

import numpy as np
import pytest

from algorithms import shadowsync
from tests.runtime_util import assert_trees, reference, small_cfg, worker_batches


def test_easgd_alpha0_one_trainer_equals_local_training():
    cfg = small_cfg("shadow", steps=12, sync="easgd", alpha=0.0, trainers=1, workers_per_trainer=1)
    got = shadowsync.run(cfg)
    assert got["syncs"] > 0  # the shadow did sync, with a zero elastic force
    want = reference(cfg, worker_batches(cfg, 0, 1, 12))
    assert_trees(got["final_state"].params, want.params, rtol=1e-5, atol=1e-7)
    assert_trees(got["final_state"].tables, want.tables, rtol=1e-5, atol=1e-7)


def test_easgd_alpha0_equals_no_sync_bit_for_bit():
    """n replicas with a zero elastic force train exactly as n independent replicas."""
    kw = dict(steps=16, trainers=2, workers_per_trainer=2, stragglers="lognormal:sigma=0.3")
    a = shadowsync.run(small_cfg("shadow", sync="easgd", alpha=0.0, **kw))
    b = shadowsync.run(small_cfg("shadow", sync="none", **kw))
    assert a["syncs"] > 0 and b["syncs"] == 0
    assert_trees(a["final_state"], b["final_state"])


def test_fr_ma_every_step_equals_sync_sgd_on_global_batch():
    """FR-MA, k=1, alpha=1, SGD, one worker per trainer == sync SGD on the n*B global batch.

    The embeddings are one shared copy on the PS that receives each trainer's batch-mean row
    gradient, i.e. lr * n * (global-batch mean gradient) per step; the reference (mean loss over
    n*B) therefore uses n x the sparse learning rate.
    """
    n, steps, lr = 3, 8, 0.05
    cfg = small_cfg("fr", steps=n * steps, sparse=("sgd", lr), sync="ma", alpha=1.0, sync_gap=1,
                    trainers=n, workers_per_trainer=1)
    got = shadowsync.run(cfg)
    per_worker = [worker_batches(cfg, w, n, steps) for w in range(n)]
    glob = [type(b[0])(*(None if x[0] is None else np.concatenate(x) for x in zip(*b)))
            for b in zip(*per_worker)]
    ref_cfg = small_cfg("single", sparse=("sgd", n * lr))
    want = reference(ref_cfg, glob)
    assert got["avg_sync_gap"] == 1.0
    assert_trees(got["final_state"].params, want.params, rtol=1e-5, atol=1e-6)
    assert_trees(got["final_state"].tables, want.tables, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["fr", "shadow"])
def test_bmuf_eta1_momentum0_equals_ma(algo):
    kw = dict(steps=16, trainers=2, workers_per_trainer=1, alpha=0.5, sync_gap=2)
    ma = shadowsync.run(small_cfg(algo, sync="ma", **kw))
    bmuf = shadowsync.run(small_cfg(algo, sync="bmuf", bmuf_lr=1.0, bmuf_momentum=0.0, **kw))
    assert ma["syncs"] == bmuf["syncs"] > 0
    assert ma["schedule"].trace == bmuf["schedule"].trace
    assert_trees(ma["final_state"], bmuf["final_state"], rtol=1e-5, atol=1e-6)


def test_deterministic_runs_repeat_and_seeds_differ():
    kw = dict(steps=24, sync="easgd", trainers=2, workers_per_trainer=2,
              stragglers="lognormal:sigma=0.5+slow:k=1,factor=2")
    a = shadowsync.run(small_cfg("shadow", **kw))
    b = shadowsync.run(small_cfg("shadow", **kw))
    assert_trees(a["final_state"], b["final_state"])  # bit for bit
    assert a["schedule"].trace == b["schedule"].trace and a["eval_ne"] == b["eval_ne"]
    c = shadowsync.run(small_cfg("shadow", train={"seed": 1}, **kw))
    assert c["schedule"].trace != a["schedule"].trace  # another interleaving of the same roles
    assert a["clock"] == "virtual" and a["examples_per_sec"] > 0


def test_summary_counters_and_average_model(tmp_path):
    cfg = small_cfg("shadow", steps=16, sync="bmuf", bmuf_lr=0.8, bmuf_momentum=0.5, nesterov=True,
                    trainers=2, workers_per_trainer=2, return_model="average",
                    placement="binpack", ps_shards=3, train={"out": str(tmp_path)})
    s = shadowsync.run(cfg)
    assert s["avg_sync_gap"] == pytest.approx(16 / s["syncs"])
    assert s["sync_bytes"] > 0 and s["syncs_per_sec"] > 0
    assert len(s["ps_load_profile"]["binpack"]) == 3
    assert max(s["ps_load_profile"]["binpack"]) <= max(s["ps_load_profile"]["mod"])
    assert (tmp_path / "summary.json").exists() and (tmp_path / "checkpoints").exists()
