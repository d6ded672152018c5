"""Host-async schedules pinned against hand-written ones (issue 14's two runtime bugs).

Equal speeds: no stragglers, the same modelled compute per batch, free links (infinite
bandwidth), so every worker finishes each batch at the same virtual instant and the schedule
can be written out by hand.
"""

import pytest

from algorithms import async_ps, shadowsync
from tests.runtime_util import small_cfg

FREE = dict(bandwidth_gbps=float("inf"))


def test_async_staleness_of_a_hand_written_schedule():
    """Bug reproduced: staleness counted one too high (one worker alone reports 1, not 0).

    2 workers, 6 batches each, in lockstep. At t = c both push: worker 0's gradient (pulled at
    version 0) is applied at version 0 (staleness 0), worker 1's (pulled at 0) at version 1
    (staleness 1); each then pulls the version after its own push, and from then on one other
    push always lands in between: 1 x staleness 0, 11 x staleness 1. One worker alone: 6 x 0.
    """
    two = async_ps.run(small_cfg("async", steps=12, trainers=1, workers_per_trainer=2, **FREE))
    assert two["staleness_histogram"] == {"0": 1, "1": 11}
    one = async_ps.run(small_cfg("async", steps=6, trainers=1, workers_per_trainer=1, **FREE))
    assert one["staleness_histogram"] == {"0": 6}
    assert one["mean_staleness"] == 0.0


@pytest.mark.parametrize("k,want", [(1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), (2, [2, 4, 6, 8, 10]),
                                    (5, [5, 10])])
def test_fr_sync_schedule(monkeypatch, k, want):
    """Bug reproduced: FR sync firing one iteration early (``it % k == 0`` on the 0-based
    iteration syncs after iterations 1, k+1, 2k+1, ...). FR-MA syncs each worker's replica
    after its iterations k, 2k, ... (ShadowSync Sec. 3, foreground sync every k iterations):
    written out here for k = 1, 2, 5 over 10 iterations per worker."""
    seen: dict[int, list[int]] = {}
    orig = shadowsync.Syncer.step

    def step(self, rt, counters):
        # FR syncers count into their worker's counters
        seen.setdefault(id(counters), []).append(counters.iterations)
        return (yield from orig(self, rt, counters))

    monkeypatch.setattr(shadowsync.Syncer, "step", step)
    s = shadowsync.run(small_cfg("fr", steps=20, sync="ma", sync_gap=k, trainers=2,
                                 workers_per_trainer=1, **FREE))
    assert list(seen.values()) == [want, want]
    assert s["syncs"] == 2 * len(want) and s["avg_sync_gap"] == pytest.approx(10 / len(want))
