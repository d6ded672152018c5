"""ShadowSync across checkpoints (issue 34 step 2): a checkpoint keeps every trainer's replica as
it is (with wPS and the BMUF states), the next interval or a --resume goes on from them, and the
summary's counters are the whole run's, not the last interval's."""

import dataclasses
import json
import os

import jax
import numpy as np

import algorithms
from algorithms import shadowsync
from algorithms.runtime import Replica
from algorithms.runtime.ps import SyncPS
from recjax.checkpoint import Checkpointer
from recjax.data.synthetic import SyntheticSource
from recjax.train.setup import build
from tests.runtime_util import small_cfg


def _cfg(tmp_path, name, sync="easgd", **train):
    cfg = small_cfg("shadow", steps=16, trainers=2, workers_per_trainer=2, sync=sync,
                    train={"out": str(tmp_path / name), "ckpt_every": 8, "keep_ckpts": 4,
                           **train})
    return cfg


def _own_at(cfg, step):
    """The checkpoint's own arrays at `step`, restored with the structure a run builds."""
    _, _, _, init = build(cfg, SyntheticSource(cfg.synthetic).spec)
    n = cfg.runtime.trainers
    like = {"replicas": [(init.params, init.opt_state)] * n,
            "counters": np.zeros(3, np.int64)}
    if cfg.shadowsync.sync == "easgd":
        like["center"] = init.params
    ckpt = Checkpointer(os.path.join(cfg.train.out, "checkpoints"))
    state, _ = ckpt.restore(jax.tree.map(np.asarray, init), step)
    own = ckpt.restore_extra(step, jax.tree.map(np.asarray, like))
    ckpt.close()
    return state, own


def test_a_checkpoint_keeps_every_replica_and_wps(tmp_path):
    cfg = _cfg(tmp_path, "a", stop_after=8)
    algorithms.run(cfg)
    state, own = _own_at(cfg, 8)
    (p0, o0), (p1, _) = own["replicas"]
    # the train state is the returned model (trainer 1's replica); the others are kept as
    # they are, not reset to it: the replicas differ, and wPS is a third model
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(p0)):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)))
    assert any(not np.array_equal(a, b)
               for a, b in zip(jax.tree.leaves(own["center"]), jax.tree.leaves(p1)))
    syncs, nbytes, iters = own["counters"]
    assert iters == 8 and syncs > 0 and nbytes > 0


def test_counters_cover_the_whole_run_through_intervals_and_resume(tmp_path):
    whole = algorithms.run(_cfg(tmp_path, "whole"))
    with open(os.path.join(tmp_path, "whole", "metrics.jsonl")) as f:
        at8 = [r for r in map(json.loads, f) if r["kind"] == "counters" and r["step"] == 8][-1]
    # 16 worker iterations of the whole run over all its syncs (the last interval alone had 8)
    assert whole["avg_sync_gap"] == 16 / whole["syncs"]
    assert 0 < at8["syncs"] < whole["syncs"]
    _, own = _own_at(_cfg(tmp_path, "whole"), 16)
    assert list(own["counters"]) == [whole["syncs"], whole["sync_bytes"], 16]
    # stopped at 8 and resumed: the same run, the same whole-run counters
    algorithms.run(_cfg(tmp_path, "parts", stop_after=8))
    resumed = algorithms.run(_cfg(tmp_path, "parts", resume=True))
    assert (resumed["syncs"], resumed["sync_bytes"]) == (whole["syncs"], whole["sync_bytes"])
    assert resumed["eval_auc"] == whole["eval_auc"]


def test_a_checkpoint_of_another_algorithm_starts_the_replicas_from_its_model(tmp_path):
    single = dataclasses.replace(_cfg(tmp_path, "h", stop_after=0), train=dataclasses.replace(
        _cfg(tmp_path, "h").train, algo="single", steps=8, ckpt_every=0, deterministic=False))
    algorithms.run(single)
    cfg = _cfg(tmp_path, "h", resume=True)
    out = algorithms.run(cfg)  # no replicas in the checkpoint: each starts from its model
    # and the counters start at the resume: its 8 iterations over its own syncs
    assert out["steps"] == 16 and out["avg_sync_gap"] == 8 / out["syncs"]


def test_restore_puts_back_every_replica_wps_and_bmuf_state():
    class Rt:  # a runtime whose checkpoint holds `saved`
        def __init__(self, saved):
            self.saved = saved

        def restore_own(self, like):
            assert jax.tree.structure(like) == jax.tree.structure(self.saved)
            return self.saved

    class Syncer:
        def __init__(self, bmuf):
            self.bmuf = bmuf

    z = {"w": np.zeros(3, np.float32)}
    replicas = [Replica(z, ()) for _ in range(2)]
    server = SyncPS(z, exchange=None)
    syncers = [Syncer((z, z)), Syncer((z, z))]
    saved = {"replicas": [({"w": np.full(3, 1.0, np.float32)}, ()),
                          ({"w": np.full(3, 2.0, np.float32)}, ())],
             "counters": np.array([5, 6, 7], np.int64), "center": {"w": np.full(3, 3.0)},
             "bmuf": [({"w": np.full(3, 4.0)}, z), ({"w": np.full(3, 5.0)}, z)]}
    base = shadowsync.restore_own(Rt(saved), replicas, server, syncers)
    assert list(base) == [5, 6, 7]
    assert [float(r.params["w"][0]) for r in replicas] == [1.0, 2.0]
    assert float(server.snapshot()["w"][0]) == 3.0
    assert [float(s.bmuf[0]["w"][0]) for s in syncers] == [4.0, 5.0]
