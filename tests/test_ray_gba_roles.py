"""GBA with its worker roles in their Ray worker actors (``--ray.roles actors``, the default
under ``--backend ray``; algorithms/runtime/ray_roles.py): PS0 hands out the data list's
indices (`supply.EntryIndex`), each worker actor reads the entries it gets
(`supply.EntryReader`), waits on the mode's gate in PS0's actor (`ray_wire.RemoteSignal`) and
pushes its gradient to PS0 itself.

Slow tests (Ray): ``make test-all``. The gate, `EntryReader` and `RemoteSignal` without Ray:
tests/test_ray_roles_gate.py, tests/test_entry_list.py.
"""

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from algorithms import gba  # noqa: E402
from tests.runtime_util import (  # noqa: E402
    assert_trees,
    on_ray,
    reference,
    small_cfg,
    worker_batches,
)


@pytest.mark.slow
def test_sync_mode_in_the_actors_is_train_step_on_the_global_batch(cluster, monkeypatch):
    """Sync (every worker's gradient at one version per update) is deterministic whatever the
    timing: with 2 worker actors, B_a = 32 and the embedding mean over the buffer it is the
    single trainer's `train_step` on the 64-row global batches (the reference, not the
    backend). Each worker actor read only the entries it trained on (rows read: 32 per
    entry, 2 x 8 entries in all), the driver read no training batch (no "data list" reader),
    and the roles ran in the actors: no role-side `take` or `compute` in this process."""
    from algorithms.runtime import ray_workers, supply

    def here(*_):
        raise AssertionError("a batch was taken in the driver")

    monkeypatch.setattr(supply.SharedList, "take", here)
    monkeypatch.setattr(ray_workers.RayWorker, "compute", here)
    steps = 8
    cfg = on_ray(small_cfg("gba", steps=steps, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                           mode="sync", workers=2, local_batch_size=32,
                           embedding_mean="buffer"), roles="actors")
    s = gba.run(cfg)
    want = reference(cfg, worker_batches(cfg, 0, 1, steps))
    got = s["final_state"]
    assert s["backend"] == "ray" and int(got.step) == steps and s["updates"] == steps
    assert s["gradients_applied"] == s["tokens_handed_out"] == 2 * steps
    assert s["dense_staleness"]["max"] == 0 and s["lost_roles"] == []
    assert_trees(got.params, want.params, rtol=1e-4, atol=1e-7)
    assert_trees(got.tables, want.tables, rtol=1e-4, atol=1e-7)
    assert_trees(got.slots, want.slots, rtol=1e-4, atol=1e-7)
    readers = s["data_rows_read"]["by_reader"]
    assert "data list" not in readers
    assert readers["worker 0"] + readers["worker 1"] == 32 * 2 * steps, readers


@pytest.mark.slow
def test_gba_mode_in_the_actors_drops_by_token_and_learns(cluster):
    """GBA's own mode with a straggler (factor 40, slept in its actor): the fast worker takes
    more entries, every entry is applied or dropped once, the staleness the PS measured is
    bounded by iota where gradients were kept, and the model learns."""
    cfg = on_ray(small_cfg("gba", steps=40, dense=("adam", 0.01), sparse=("adagrad", 0.05),
                           mode="gba", workers=2, local_batch_size=32,
                           stragglers="slow:k=1,factor=40"), roles="actors")
    s = gba.run(cfg)
    assert s["updates"] == 40
    assert s["gradients_applied"] + s["dropped_gradients"] == s["tokens_handed_out"] == 80
    fast, slow = sorted(s["local_qps"], reverse=True)
    assert fast > 2 * slow, s["local_qps"]  # the seed's straggler took fewer entries
    assert np.isfinite(s["eval_ne"]) and s["eval_ne"] < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("roles", ["driver", "actors"])
def test_killed_worker_of_gba_returns_no_token(cluster, roles):
    """GBA's sync mode waits for all N workers: a killed worker lowers N, so the run ends
    (with the role in the actor, the driver sees the process die and tells PS0, once)."""
    base = small_cfg("gba", steps=20, workers=2, mode="sync")
    s = gba.run(on_ray(base, kill="worker:1@3", roles=roles))
    assert s["lost_workers"] == [1] and len(s["lost_roles"]) == 1
    assert s["updates"] >= 20 - 1
    assert np.isfinite(s["eval_ne"])


@pytest.mark.slow
def test_a_role_waiting_in_its_actor_past_the_watchdog_stops_the_run(cluster, monkeypatch):
    """A role parked on GBA's gate in its actor yields a chunk at a time (the driver can hold
    it for an eval), so the chunks spent waiting count as silence (``runtime.watchdog_s``), as
    a Wait in a driver thread does. Made to hang: PS0 is not told of the killed worker, so
    sync mode waits for its gradient for ever."""
    from algorithms.runtime import ray_role_driver
    from algorithms.runtime.watchdog import RoleStalledError

    real = ray_role_driver.remote_role
    monkeypatch.setattr(ray_role_driver, "remote_role",
                        lambda fn, worker, *args, lost=None: real(fn, worker, *args))
    base = small_cfg("gba", steps=20, workers=2, mode="sync", watchdog_s=4.0)
    with pytest.raises(RoleStalledError, match="waited on a Wait in its Ray actor"):
        gba.run(on_ray(base, kill="worker:1@3", roles="actors", chunk_s=0.5))
