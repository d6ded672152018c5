"""bench_ray --serial's arithmetic (algorithms/tools/bench_ray_serial.py), against hand-worked
figures; and its sampler against CPU burnt on purpose (no Ray)."""

import subprocess
import sys
import threading
import time

import pytest

from algorithms.runtime import worker
from algorithms.tools import bench_ray_serial as bs


def test_between_takes_the_window_and_each_process_s_own_delta():
    # (t, box busy, driver CPU, {pid: CPU}, driver rss, {(thread id, group): CPU})
    main, io, r1, r2 = (1, "main"), (2, "io"), (3, "role-#"), (4, "role-#")
    samples = [(0.0, 1.0, 0.5, {7: 1.0}, 10, {main: 0.4}),
               (1.0, 2.0, 0.7, {7: 1.5}, 30, {main: 0.5, io: 0.25, r1: 0.5}),  # first in it
               # pid 9 started inside: all of it counts; so does thread r2
               (2.0, 3.5, 0.8, {7: 2.0, 9: 0.25}, 50, {main: 0.5, io: 0.375, r1: 0.625, r2: 0}),
               # last in the window; io ended: what it had at its last sample counts
               (3.0, 4.5, 1.0, {7: 3.0, 9: 0.75}, 20, {main: 0.625, r1: 0.75, r2: 0.125}),
               (4.0, 9.0, 9.0, {7: 9.0}, 99, {})]
    got = bs._between(samples, 0.5, 3.2)
    assert got == {"seconds": 2.0, "box": 2.5, "driver": pytest.approx(0.3),
                   "tree": pytest.approx(0.3 + 1.5 + 0.75), "rss": 50,
                   "threads": {"main": 0.125, "io": 0.125, "role-#": 0.25 + 0.125}}
    with pytest.raises(RuntimeError, match="only 1 CPU samples"):
        bs._between(samples, 0.5, 1.5)


def test_marginal_figures_are_the_difference_of_two_lengths():
    short = {"steps": 24, "seconds": 4.0, "tree": 1.0, "box": 2.0, "driver": 0.2, "rss": 5,
             "m": 0.003, "gc": 0.05, "threads": {"main": 0.1, "io": 0.1}}
    long = {"steps": 96, "seconds": 13.0, "tree": 2.8, "box": 5.6, "driver": 0.56, "rss": 4,
            "m": 0.002, "gc": 0.062, "threads": {"main": 0.28, "grpc": 0.072}}
    got = bs._marginal(short, long)
    threads = got.pop("threads")
    assert got == pytest.approx({"S": 72 / 9.0, "c": 1.8 / 72, "box_c": 3.6 / 72,
                                 "driver": 0.36 / 72, "gc": 0.012 / 72, "rss": 5,
                                 "m": 0.002})
    assert threads == pytest.approx({"main": 0.18 / 72, "io": -0.1 / 72, "grpc": 0.001})


def _rep(S, c, driver=5e-4, m=0.002, rss=2**20, gc=1e-4, threads=None):
    return {"S": S, "c": c, "box_c": c, "driver": driver, "gc": gc, "m": m, "rss": rss,
            "threads": threads or {"main": driver}}


def test_criteria_by_hand():
    # W = 1: 8 steps/s, 25 ms; W = 16: median of three repeats
    per = {1: [_rep(8.0, 0.025), _rep(9.0, 0.020), _rep(7.0, 0.030)],
           16: [_rep(60.0, 0.022, m=0.004, threads={"main": 3e-4, "io": 2e-4}),
                _rep(50.0, 0.024, m=0.004, threads={"main": 1e-4, "io": 4e-4}),
                _rep(70.0, 0.020, m=0.004, driver=2e-3, rss=3 * 2**20,
                     threads={"main": 2e-3})]}
    got = bs.criteria(per, factor=50.0, cores=2)
    # bound = min(16 x 8, 2 / 0.022) = 90.9; 60 / 90.9 = 0.66 < 0.8
    assert got["a_bound"] == pytest.approx(2 / 0.022)
    assert got["a_ratio"] == pytest.approx(60 * 0.022 / 2) and not got["a_met"]
    # S_free = 16 / (1 / 8 + 49 x (0.004 - 0.002)) = 16 / 0.223 = 71.7; min with 90.9
    assert got["S_free"] == pytest.approx(16 / (1 / 8 + 49 * 0.002))
    assert got["a_free_ratio"] == pytest.approx(60 / (16 / 0.223)) and got["a_free_met"]
    assert got["b_ratio"] == pytest.approx(0.022 / 0.025) and got["b_met"]
    assert got["driver_1"] == 5e-4 and got["driver_16"] == 5e-4 and got["driver_met"]
    assert got["driver_peak_rss_16_mib"] == 3.0 and got["gc_16"] == 1e-4
    # per group the median of three (a missing group is 0), largest first
    assert got["threads_1"] == {"main": 5e-4}
    assert list(got["threads_16"].items()) == [("main", 3e-4), ("io", 2e-4)]
    # c_16 above 1.25 x c_1, a driver over 1 ms: not met
    per[16] = [_rep(60.0, 0.032, driver=1.1e-3)] * 3
    got = bs.criteria(per, factor=50.0, cores=2)
    assert not got["b_met"] and not got["driver_met"]


def test_gc_pauses_are_timed_while_inside_and_only_then():
    import gc

    n = len(gc.callbacks)
    with bs._gc_pauses() as pauses:
        t0 = time.perf_counter()
        junk = [[i] for i in range(200_000)]  # a collection with something to traverse
        for _ in range(3):
            gc.collect()
    t1 = time.perf_counter()
    gc.collect()  # outside: not recorded
    del junk
    assert len(pauses) >= 3 and len(gc.callbacks) == n
    assert all(t0 <= t and s > 0 and t + s <= t1 for t, s in pauses), (t0, t1, pauses)


def test_measured_notes_each_step_s_measured_compute_and_passes_it_on(monkeypatch):
    calls = []
    monkeypatch.setattr(worker, "record_step", lambda *a: calls.append(a) or "work")
    fake = worker.record_step
    with bs._measured() as secs:
        assert worker.record_step("rt", 3, "c", "item", "m", 5, 0.25, 4.0) == "work"
        worker.record_step("rt", 3, "c", "item", "m", 6)  # not timed: not noted
    assert worker.record_step is fake
    assert secs == [0.25]
    assert calls == [("rt", 3, "c", "item", "m", 5, 0.25, 4.0),
                     ("rt", 3, "c", "item", "m", 6, None, None)]


def _burn(seconds: float) -> None:
    c0 = time.thread_time()
    while time.thread_time() - c0 < seconds:
        pass


def test_sampling_counts_the_driver_and_its_children():
    # a child that burns 0.4 s of CPU, says so, and lives on (an exited child's CPU is gone)
    child = [sys.executable, "-c", "import time\nc = time.process_time()\n"
             "while time.process_time() - c < 0.4: pass\nprint('done', flush=True)\n"
             "time.sleep(30)"]
    # two burners that end inside the window, each after a sample saw all its CPU (a thread's
    # CPU after its last sample is lost by design: under load the sampler may not run for a while)
    go, release = threading.Event(), threading.Event()
    burnt = [threading.Event() for _ in range(2)]

    def burner(done: threading.Event) -> None:
        go.wait()
        _burn(0.1)
        done.set()
        release.wait(10)

    burners = [threading.Thread(target=burner, args=(e,), name=f"burner-{i}")
               for i, e in zip((7, 12), burnt)]
    for b in burners:
        b.start()
    with bs._sampling(0.02) as samples:
        time.sleep(0.1)
        p = subprocess.Popen(child, stdout=subprocess.PIPE, text=True)
        _burn(0.3)
        go.set()
        assert all(e.wait(10) for e in burnt)
        n, deadline = len(samples), time.monotonic() + 10
        while len(samples) < n + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
        for b in burners:
            b.join(timeout=10)  # ended inside: their last sampled CPU counts
        assert p.stdout.readline().strip() == "done"
        time.sleep(0.1)
    p.kill()
    p.wait()
    got = bs._between(samples, samples[0][0], samples[-1][0])
    # the driver: the main thread's 0.3 s, the burners' 2 x 0.1 s and little else
    assert 0.46 <= got["driver"] <= 0.65
    assert 0.38 <= got["tree"] - got["driver"] <= 0.6  # the child's 0.4 s (and its start)
    # by thread: the burners are one group, digits folded; the sampler is not there
    main = threading.current_thread().name
    assert 0.28 <= got["threads"][main] <= 0.4
    assert 0.12 <= got["threads"]["burner-#"] <= 0.22, got["threads"]
    assert bs.SAMPLER not in got["threads"] and "burner-7" not in got["threads"]


@pytest.mark.parametrize("workers", [1, 16])
def test_gba_serial_config_counts_worker_steps_as_data_list_entries(workers):
    """``--serial-algo gba``: W workers of B_a rows, M = N = W, and `steps` worker steps in all
    (train.steps global steps of M entries each), so S_W counts what async's counts."""
    from algorithms import gba
    from algorithms.tools.bench_ray import gba_serial_config

    cfg = gba_serial_config("ray", workers, 24 * workers, 512, "slow:k=1,factor=50",
                            model="default", roles="actors")
    p = gba.plan(cfg)
    assert (p.mode, p.workers, p.m, p.local_batch) == ("gba", workers, workers, 512)
    assert cfg.train.steps * p.m == 24 * workers and cfg.ray.roles == "actors"
    assert cfg.runtime.stragglers == "slow:k=1,factor=50"


@pytest.mark.parametrize("workers", [1, 4])
def test_persia_serial_config_counts_worker_steps_as_nn_worker_slices(workers):
    """``--serial-algo persia``: W NN workers of B rows each (the global batch W x B), W // 2
    embedding workers (at least one), and `steps` NN worker steps in all."""
    from algorithms import persia
    from algorithms.tools.bench_ray import persia_serial_config

    cfg = persia_serial_config("ray", workers, 24 * workers, 512, "slow:k=1,factor=50",
                               model="default", roles="actors")
    p = persia.plan(cfg)
    assert (p.mode, p.nn_workers, p.embedding_workers, p.local_batch, p.tau) == (
        "hybrid", workers, max(1, workers // 2), 512, 4)
    assert cfg.train.steps * p.nn_workers == 24 * workers and cfg.ray.roles == "actors"
    assert cfg.runtime.stragglers == "slow:k=1,factor=50"


def test_chunk_s_sets_the_runs_chunk_and_nothing_else():
    """``--serial --chunk-s``: the runs' ``ray.chunk_s``, every other field as the config's."""
    import dataclasses

    from algorithms.tools.bench_ray import persia_serial_config, with_chunk_s

    args = ("ray", 4, 96, 512, "slow:k=4,factor=50")
    base, got = persia_serial_config(*args), with_chunk_s(persia_serial_config, 2.0, *args)
    assert got.ray.chunk_s == 2.0 != base.ray.chunk_s
    assert dataclasses.replace(got, ray=base.ray) == base
