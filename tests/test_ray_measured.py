"""`bench_ray --serial`'s m_W under Ray (algorithms/tools/bench_ray_serial.py): the compute each
worker step timed in its actor reaches the driver, whichever role timed it.

Slow tests (Ray): ``make test-all``.
"""

import pytest

ray = pytest.importorskip("ray")

from algorithms import async_ps, persia  # noqa: E402
from tests.runtime_util import on_ray, small_cfg  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["async", "persia"])
def test_every_step_s_timed_compute_reaches_the_driver_once(cluster, algo):
    """`bench_ray --serial`'s m_W: each worker step's compute, timed in its actor
    (`clock.Work.measured`), reaches the driver once per step, whichever role timed it: a
    worker's `compute` (async) or the role itself (Persia's NN workers, which time their
    forward/backward only when they straggle: every one does here)."""
    from algorithms.tools import bench_ray_serial as bs

    if algo == "async":
        cfg, steps = small_cfg("async", steps=12, trainers=2, workers_per_trainer=1), 12
    else:
        cfg = small_cfg("persia", steps=6, nn_workers=2, embedding_workers=1, mode="hybrid",
                        stragglers="slow:k=2,factor=1.5")
        steps = 6 * 2  # every global step is one step of each of the 2 NN workers
    with bs._measured() as secs:
        r = (async_ps if algo == "async" else persia).run(on_ray(cfg, roles="actors"))
    assert r["steps"] == cfg.train.steps
    assert len(secs) == steps and all(0 < s < 10 for s in secs), secs
