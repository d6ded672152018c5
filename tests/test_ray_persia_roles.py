"""Persia with its roles in the Ray actors (``--ray.roles actors``, the default under
``--backend ray``; algorithms/persia_roles.py, algorithms/runtime/ray_roles.py): NN worker k's
role in worker group k's actor, embedding worker e's forward and backward roles in group K + e's
actor, which reads the data list's entries and reaches the PS shards' actors itself; the
pipeline and the dense all-reduce hosted in actors of their own. The driver takes no batch and
pushes no row.

Slow tests (Ray): ``make test-all``. Persia's roles themselves: tests/test_persia.py.
"""

import dataclasses

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from algorithms import persia  # noqa: E402
from tests.runtime_util import assert_trees, on_ray, on_threads, small_cfg  # noqa: E402

K, E, STEPS, B = 2, 2, 24, 64


def _no_role_here(monkeypatch):
    """Fail if the driver takes a batch of the data list or pushes rows to the PS (both are the
    embedding workers', in their actors)."""
    from algorithms.runtime import ray_ps, supply

    def here(*_):
        raise AssertionError("a role's batch was taken or its rows pushed in the driver")

    monkeypatch.setattr(supply.SharedList, "take", here)
    monkeypatch.setattr(ray_ps.RayEmbeddingPS, "push", here)


def _cfg(mode: str, steps: int = STEPS, **fields):
    return small_cfg("persia", steps=steps, nn_workers=K, embedding_workers=E, staleness=2,
                     mode=mode, **fields)


@pytest.mark.slow
@pytest.mark.parametrize("roles", ["actors", "driver"])
def test_sync_mode_in_the_actors_is_the_threaded_run(cluster, monkeypatch, roles):
    """``--persia.mode sync`` (tau = 0: lookup, dense step and update in sequence) does the
    same arithmetic wherever its roles run: with them in the actors (compression of ids and
    values on) the model, the eval, the staleness and every byte count are the threaded run's
    (the activations computed in other processes: float32 rounding apart); the embedding
    workers' actors read exactly the run's entries of the list, each its own. With the roles
    in the driver (its threads; the NN workers' forward/backward in their actors), likewise."""
    base = _cfg("sync", compress="both")
    t = persia.run(on_threads(base))
    if roles == "driver":
        r = persia.run(on_ray(base, roles="driver"))
        assert r["embedding_staleness"] == t["embedding_staleness"] and r["bytes"] == t["bytes"]
        assert r["eval_ne"] == pytest.approx(t["eval_ne"], abs=1e-6)
        assert r["data_rows_read"]["by_reader"]["data list"] > 0
        return
    _no_role_here(monkeypatch)
    r = persia.run(on_ray(base, roles="actors"))
    assert r["backend"] == "ray" and r["steps"] == t["steps"] == STEPS
    assert r["lost_roles"] == [] and r["worker_iterations"] == K * STEPS
    assert r["embedding_updates"] == STEPS
    assert r["embedding_staleness"] == t["embedding_staleness"] == {
        "mean": 0.0, "max": 0, "histogram": {"0": STEPS}}
    assert r["bytes"] == t["bytes"] and r["bytes"]["embedding->nn"]["sent"] < \
        r["bytes"]["embedding->nn"]["raw"]
    assert r["eval_ne"] == pytest.approx(t["eval_ne"], abs=1e-6)
    assert_trees(r["final_state"].params, t["final_state"].params, rtol=1e-4, atol=1e-6)
    readers = r["data_rows_read"]["by_reader"]
    assert "data list" not in readers  # (the driver's reader of the list: threads only)
    assert sorted(readers) == ["profile", *(f"worker {K + e}" for e in range(E))], readers
    assert sum(readers[f"worker {K + e}"] for e in range(E)) == STEPS * B


@pytest.mark.slow
def test_hybrid_in_the_actors_keeps_its_bound_and_recovers_both_failures(cluster, monkeypatch):
    """Hybrid, tau = 2, with an NN worker failing at step 5 and PS shard 0 wiped after update 7
    (snapshots every 4): the staleness stays within tau (Eq. 5, now across processes), the
    NN workers reload the dense snapshot once and the shard its snapshot at update 4 (3
    updates lost), as on threads; the model learns."""
    base = _cfg("hybrid", fail_nn_at=5, fail_ps_at=7, snapshot_every=4)
    _no_role_here(monkeypatch)
    r = persia.run(on_ray(base, roles="actors"))
    assert r["steps"] == STEPS and r["embedding_updates"] == STEPS and r["lost_roles"] == []
    hist = r["embedding_staleness"]
    assert hist["max"] <= 2 and sum(hist["histogram"].values()) == STEPS
    assert (r["nn_recoveries"], r["ps_recoveries"], r["ps_updates_lost"]) == (1, 1, 3)
    assert np.isfinite(r["eval_ne"]) and r["eval_ne"] < 1.0


@pytest.mark.slow
def test_async_mode_checkpoints_from_the_actors_and_resumes_on_threads(cluster, tmp_path):
    """Async mode (the dense PS hosted in an actor of its own): 16 steps in the actors with a
    checkpoint, then ``--resume`` on threads to 24: the counts of the two runs add up, and the
    resumed run starts from the checkpoint's dense params (read from the hosted PS)."""
    out = str(tmp_path / "run")
    base = _cfg("async", steps=16, train={"out": out})
    s = persia.run(on_ray(base, roles="actors"))
    assert s["steps"] == 16 and sum(s["dense_staleness"]["histogram"].values()) == K * 16
    more = dataclasses.replace(on_threads(base), train=dataclasses.replace(
        on_threads(base).train, steps=STEPS, resume=True))
    r = persia.run(more)
    assert r["backend"] == "threads" and r["resumed_from_step"] == 16 and r["steps"] == STEPS
    assert r["embedding_updates"] == STEPS
    assert sum(r["dense_staleness"]["histogram"].values()) == K * STEPS
    # (each NN worker's pull and push per step: the two runs' bytes in proportion to steps)
    assert r["bytes"]["nn<->dense-ps"]["raw"] * 16 == s["bytes"]["nn<->dense-ps"]["raw"] * STEPS
    assert np.isfinite(r["eval_ne"])


@pytest.mark.slow
def test_a_killed_persia_worker_stops_the_run_naming_it(cluster, tmp_path):
    """kill -9 of NN worker 0's actor before its 5th iteration: its batches in flight are gone
    and every later step waits for them, so the run stops at once with `StateLost`, naming the
    group and the latest checkpoint, instead of hanging until the watchdog."""
    from algorithms.runtime.segments import StateLost

    base = _cfg("hybrid", steps=40)
    with pytest.raises(StateLost, match="worker group 0 died.*no committed checkpoint"):
        persia.run(on_ray(base, roles="actors", kill="worker:0@5"))


@pytest.mark.slow
def test_dense_shards_cut_the_nn_workers_replica_and_all_reduce_into_blocks(cluster, monkeypatch):
    """``--ray.dense_shards 3``: the NN workers' dense replica and its all-reduce in three
    actors, each of a block of whole leaves (`ray_dense.GroupBlocks`; each NN worker joins
    every block at once, `ray_wire.BlockGroup`). Sync mode with an NN worker failing at step
    7 (snapshots every 4): the model, the eval and the recovery are the threaded run's, so
    every block reduced the same parties' gradients and reloaded its snapshot together."""
    from algorithms.runtime import ray_dense

    made, init = [], ray_dense.GroupBlocks.__init__
    monkeypatch.setattr(ray_dense.GroupBlocks, "__init__",
                        lambda self, servers, *a: made.append(len(servers)) or
                        init(self, servers, *a))
    base = _cfg("sync", fail_nn_at=7, snapshot_every=4)
    t = persia.run(on_threads(base))
    r = persia.run(on_ray(base, roles="actors", dense_shards=3))
    assert made == [3] and r["steps"] == STEPS and r["lost_roles"] == []
    assert (r["nn_recoveries"], r["dense_steps_lost"]) == (t["nn_recoveries"],
                                                           t["dense_steps_lost"])
    assert (t["nn_recoveries"], t["dense_steps_lost"]) == (1, 2)  # reloaded at 6, saved at 4
    assert r["eval_ne"] == pytest.approx(t["eval_ne"], abs=1e-6)
    assert_trees(r["final_state"].params, t["final_state"].params, rtol=1e-4, atol=1e-6)
