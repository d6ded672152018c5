"""Ray backend benchmark: the price of processes, the engine's scaling, one call's overhead.

    python scripts/bench_ray.py [--repeats 5] [--quick] [--json FILE]

The measurements, in one process. Each training run goes through `algorithms.run` (its
checks, and no Ray process outliving the run): a Ray run starts a local Ray instance and stops
it after, and the instance's start, the actors' start and compile are outside the timed part,
which is the roles' run. Measurements 3 and 6's floor time one role's calls in isolation, no
training run, on an instance of their own:

1. ``processes``: async PS (Downpour) with 2 workers on DLRM-shaped batches (the dlrm_kaggle
   model: MLPerf MLPs 13-512-256-64 / 512-256-1, 26 tables, D = 16; B = --batch-size,
   default 4096, 200 steps; ``--quick``: B = 1024, 30 steps), threads vs Ray worker
   processes, interleaved per repeat; the median of the per-repeat ratios Ray / threads
   (examples/sec).
2. ``scaling``: the same async PS with 1, 2, 4 workers whose compute is mostly modelled time
   (``--stragglers slow:k=W,factor=F``, F = 50: every worker sleeps (F - 1) x its measured
   gradient computation after each step; B = 512, default model, 100 steps per worker), on
   Ray; throughput at 4 workers / at 1 (4 if nothing serializes them), and the share of a
   1-worker step that is modelled time (against a run at factor 1).
3. ``call``: one pull and one push of a B-row DLRM batch through a PS shard actor vs the
   shard in this process (ms, median over 50 calls, and the bytes each moves; a worker
   actor's own pull and push move only the batch's real rows, ``worker_actor_*_bytes``).
4. ``real`` (``--real 1,2,4,8``, for a host with the cores: not in `bench_ray`): the async PS
   on Ray with 1, 2, 4, 8 worker processes doing real compute (dlrm_kaggle, B = --batch-size,
   --per-worker steps each, one XLA thread per process), throughput at W workers / at 1.
5. ``algos`` (``--algos async,shadow,fr,gba,persia``: not in `bench_ray`): each host-async
   algorithm with 2 workers on DLRM-shaped batches, threads vs Ray, interleaved per repeat:
   its median ratio Ray / threads (what measurement 1 gives for the async PS). Two workers of
   B = --batch-size rows each: async, S-/FR-EASGD (2 trainers of one worker), GBA (2 workers
   of B_a = B, global batch 2B), Persia hybrid (2 NN and 2 embedding workers, global batch 2B).
6. ``cpu`` (``--cpu``: not in `bench_ray`): where measurement 1's price of processes goes. The
   box's CPU per worker step (every process and the kernel, `psutil.cpu_times`, sampled over
   the middle half of a run) of the threaded run and the Ray run, and of Ray's *messaging
   floor*: the messages of a Ray async-PS step, their route, count and sizes taken from the
   run's own config and batch (the batch and dense params to a worker actor, one pull and one
   push per shard from it, the dense gradients back), with nothing computed and no PS work,
   2 workers at a time. A Ray run cannot cost less than the threaded run's work plus the
   floor (less what one XLA thread per process saves), which bounds Ray / threads on this
   host without any of our code in it.
7. ``serial`` (``--serial``: not in `bench_ray`): whether the backend has a serial part, and
   whether its CPU per worker step grows with the workers, at 1 and 16 workers of modelled
   compute (``bench_ray_serial.py``).
`bench_ray(repeats, quick) -> list[dict]` is what scripts/bench.py calls.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import pathlib
import statistics
import sys
import time

import numpy as np
import psutil

from algorithms.tools import roles
from algorithms.tools.bench_ray_configs import (  # noqa: F401 (the benchmark's names)
    algo_config,
    bench_config,
    gba_serial_config,
    persia_serial_config,
    with_chunk_s,
)
from recjax import registry
from recjax.concurrency import ThreadGroup
from recjax.config import RayConfig
from recjax.config_async import SYNC_RULES

ALGOS = registry.names(kind=registry.HOST_ASYNC)
# Measurement 2's slowdown. A straggler sleeps (F - 1) x its measured gradient computation
# (`clock.Work.measured`), about 2.5 ms at B = 512 on the default model, against about 20 ms a
# step spends in Ray calls: F = 50 makes about 90% of a step modelled time.
SCALING_FACTOR = 50.0


@contextlib.contextmanager
def _local_ray():
    """A local Ray instance for the actors started inside (`bench_floor`), stopped after.
    (A training run cannot share it: `algorithms.run` stops every instance this process
    started when the run ends.)"""
    from algorithms.runtime import ray_backend

    cluster = ray_backend.Cluster(RayConfig())
    try:
        yield
    finally:
        cluster.stop()


def _versus(runs: dict[str, list[float]]) -> dict:
    """Threads vs Ray examples/sec of interleaved repeats: medians and per-repeat ratios."""
    ratios = [a / b for a, b in zip(runs["ray"], runs["threads"])]
    return {"threads_examples_per_sec_median": statistics.median(runs["threads"]),
            "ray_examples_per_sec_median": statistics.median(runs["ray"]),
            "ratio_ray_to_threads_median": statistics.median(ratios),
            "ratios_all": ratios, "threads_all": runs["threads"], "ray_all": runs["ray"]}


def _eps(cfg, cpu: list | None = None) -> float:
    """A run's examples/sec; with `cpu`, the driver's CPU per step (its roles' run, every
    thread of this process: `roles.timed`) appended to it."""
    import algorithms

    t = time.perf_counter()
    with roles.timed() as run:
        eps = algorithms.run(cfg)["segment_examples_per_sec"]
    if cpu is not None:
        cpu.append(run["cpu_seconds"] / cfg.train.steps)
    rt = cfg.runtime
    print(f"  {cfg.train.algo} {rt.backend} workers={rt.trainers} B={cfg.train.batch_size} "
          f"steps={cfg.train.steps} {rt.stragglers}: {eps:,.0f} ex/s "
          f"({time.perf_counter() - t:.1f} s with start-up)", file=sys.stderr, flush=True)
    return eps


def bench_processes(repeats: int, steps: int, batch: int) -> dict:
    runs: dict[str, list[float]] = {"threads": [], "ray": []}
    for r in range(repeats):
        for backend in ("threads", "ray"):
            runs[backend].append(_eps(bench_config(backend, 2, steps, batch, seed=r)))
    return {"name": "ray/processes", "workers": 2, "batch_size": batch, "steps": steps,
            "model": "dlrm_kaggle", "repeats": repeats, **_versus(runs)}


def bench_scaling(repeats: int, per_worker: int, batch: int, factor: float) -> dict:
    """Async PS on Ray, every worker `factor` x slower (its gradient computation, timed in its
    actor, is followed by a sleep of (factor - 1) x that time), 1, 2, 4 workers of
    `per_worker` steps each (so each count's start is the same share of its run).

    A run of 1 worker at factor 1 in each repeat measures what share of a straggling step
    is modelled time, ``modelled_share`` = (t_factor - t_1) / t_factor of its step times:
    what the measurement's premise, compute mostly modelled, rests on."""
    eps: dict[int, list[float]] = {1: [], 2: [], 4: []}
    shares = []
    for r in range(repeats):
        nominal = _eps(bench_config("ray", 1, per_worker, batch, model="default", seed=r))
        for w in eps:
            cfg = bench_config("ray", w, per_worker * w, batch, f"slow:k={w},factor={factor}",
                               model="default", seed=r)
            eps[w].append(_eps(cfg))
        shares.append(1.0 - eps[1][-1] / nominal)  # (t_F - t_1) / t_F, t = batch / eps
    ratios = [a / b for a, b in zip(eps[4], eps[1])]
    return {"name": "ray/scaling", "model": "dlrm (default config)", "batch_size": batch,
            "steps_per_worker": per_worker, "straggler_factor": factor, "repeats": repeats,
            "modelled_share_median": statistics.median(shares),
            "examples_per_sec_median": {str(w): statistics.median(v) for w, v in eps.items()},
            "speedup_4_over_1_median": statistics.median(ratios),
            "speedup_2_over_1_median": statistics.median(
                [a / b for a, b in zip(eps[2], eps[1])]), "all": eps, "speedup_4_over_1_all":
            ratios, "modelled_share_all": shares}


def bench_real(repeats: int, workers: list[int], per_worker: int, batch: int,
               shards: int = 0, roles: str = "auto") -> dict:
    """Ray worker processes with real compute: examples/sec at each W and its speedup over 1."""
    eps: dict[int, list[float]] = {w: [] for w in workers}
    for r in range(repeats):
        for w in workers:
            cfg = bench_config("ray", w, per_worker * w, batch, seed=r, roles=roles)
            if shards:
                cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime,
                                                                           ps_shards=shards))
            eps[w].append(_eps(cfg))
    base = workers[0]
    return {"name": "ray/real", "model": "dlrm_kaggle", "batch_size": batch, "ps_shards": shards,
            "steps_per_worker": per_worker, "repeats": repeats,
            "examples_per_sec_median": {str(w): statistics.median(v) for w, v in eps.items()},
            f"speedup_over_{base}_median": {
                str(w): statistics.median([a / b for a, b in zip(eps[w], eps[base])])
                for w in workers}, "all": eps}


def bench_algos(algos: list[str], repeats: int, steps: int, batch: int,
                roles: tuple = ("auto",)) -> dict:
    """Each algorithm, threads vs Ray (under each ``--ray.roles`` of `roles`, interleaved),
    2 workers: examples/sec and the median ratio (one set per roles value when several),
    and the driver's CPU per step under Ray (over its roles' whole run, the compile in the
    actors and the first chunks included: not marginal, an upper bound)."""
    runs = {a: {k: [] for k in ("threads", *roles)} for a in algos}
    cpu = {a: {ro: [] for ro in roles} for a in algos}
    for r in range(repeats):
        for a in algos:
            runs[a]["threads"].append(_eps(algo_config(a, "threads", steps, batch, seed=r)))
            for ro in roles:
                runs[a][ro].append(_eps(algo_config(a, "ray", steps, batch, seed=r, roles=ro),
                                        cpu[a][ro]))

    def versus(a: str, v: dict) -> dict:
        one = {ro: {**_versus({"threads": v["threads"], "ray": v[ro]}),
                    "driver_cpu_ms_per_step_median": statistics.median(cpu[a][ro]) * 1e3}
               for ro in roles}
        return one[roles[0]] if len(roles) == 1 else one

    return {"name": "ray/algos", "workers": 2, "worker_batch_size": batch, "steps": steps,
            "model": "dlrm_kaggle", "repeats": repeats, "roles": list(roles),
            **{a: versus(a, v) for a, v in runs.items()}}


def bench_call(batch: int, n: int = 50) -> dict:
    """One pull and one push through a shard actor vs the same shard in this process.

    One PS shard's calls in isolation, no training run: the engine's `Runtime` is built
    directly (not through `algorithms.run`), its Ray instance started and stopped with it."""
    import jax

    from algorithms.runtime import ray_wire
    from algorithms.runtime.engine import Runtime

    def med(f) -> float:
        f()
        xs = []
        for _ in range(n):
            t = time.perf_counter()
            f()
            xs.append((time.perf_counter() - t) * 1e3)
        return statistics.median(xs)

    out = {"name": "ray/call", "batch_size": batch, "model": "dlrm (default config)", "calls": n}
    for backend in ("threads", "ray"):
        cfg = bench_config(backend, 1, 8, batch, model="default")
        cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, ps_shards=1))
        rt = Runtime(cfg, 1)
        try:
            local, rows = rt.warm_batch
            minis = rt.ps.pull(rows)
            _, _, rg = rt.grads(rt.init_state.params, minis, local)
            rg = jax.device_get(rg)
            out[f"{backend}_pull_ms"] = med(lambda rt=rt, rows=rows: rt.ps.pull(rows))
            out[f"{backend}_push_ms"] = med(lambda rt=rt, rows=rows, rg=rg: rt.ps.push(rows, rg))
            out["pull_bytes"] = int(sum(v.nbytes for v in minis.values())
                                    + sum(ids.nbytes for ids, _ in rows.values()))
            out["push_bytes"] = int(sum(i.nbytes + g.nbytes for i, g in rg.values())
                                    + sum(ids.nbytes for ids, _ in rows.values()))
            # a worker actor's own pull and push carry the batch's real ids and rows only
            ids_bytes = sum(real.nbytes for real, _, _ in ray_wire.wire_rows(rows).values())
            real = ray_wire.pack_rows(minis, rows)
            out["worker_actor_pull_bytes"] = int(sum(v.nbytes for v in real.values()) + ids_bytes)
            out["worker_actor_push_bytes"] = out["worker_actor_pull_bytes"]
        finally:
            rt.close()
    return out


def _box_busy() -> float:
    """CPU seconds the whole box has been busy (every process, the kernel's share included;
    not idle, I/O wait or time the hypervisor took)."""
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


@contextlib.contextmanager
def _busy_samples(period: float = 0.2):
    """``[(perf_counter, _box_busy())]``, appended every `period` s while inside."""
    samples: list[tuple[float, float]] = []
    group = ThreadGroup("bench-cpu")

    def sample(stop) -> None:
        while True:
            samples.append((time.perf_counter(), _box_busy()))
            if stop.wait(period):
                return

    group.spawn(sample, group.stop, name="sampler")
    try:
        yield samples
    finally:
        group.close()


def _window(samples: list, lo: float, hi: float) -> float:
    """The box's busy cores (CPU s per s) between times `lo` and `hi` (perf_counter)."""
    win = [s for s in samples if lo <= s[0] <= hi]
    if len(win) < 2:
        raise RuntimeError(f"only {len(win)} CPU samples in a {hi - lo:.1f} s window; "
                           "run more steps")
    (t0, b0), (t1, b1) = win[0], win[-1]
    return (b1 - b0) / (t1 - t0)


def _run_cpu(cfg) -> dict:
    """One run's examples/sec, busy cores and CPU ms per worker step over the middle half of its
    timed part (its roles' run: the `segment_seconds` before the roles ended; what follows, the
    final eval and under Ray the instance's stop, is outside)."""
    import algorithms

    with _busy_samples() as samples, roles.timed() as run:
        out = algorithms.run(cfg)
    d, eps, end = out["segment_seconds"], out["segment_examples_per_sec"], run["end"]
    cores = _window(samples, end - 0.75 * d, end - 0.25 * d)
    return {"examples_per_sec": eps, "busy_cores": cores,
            "cpu_ms_per_step": cores / (eps / cfg.train.batch_size) * 1e3}


class _FloorShard:
    """A PS shard actor that does no PS work: a pull answers the real rows' shape from a
    fixed buffer, a push is dropped (`bench_floor`)."""

    def __init__(self, dims: dict):
        self.buf = {k: np.zeros((n, d), np.float32) for k, (n, d) in dims.items()}

    def pull_rows(self, wire: dict, admit: bool = True) -> dict:
        return {k: self.buf[k][:real.size] for k, (real, _, _) in wire.items()}

    def push_rows(self, wire: dict, sums: dict) -> None:
        return None


class _FloorWorker:
    """`ComputeServer.step`'s messages, in its order, with no compute: the step's arguments
    (dense params, batch, each shard's real ids) received, the shard pulls sent and their rows
    received, the same bytes pushed back to each shard and waited for, a gradient of the
    dense params' shapes returned."""

    def __init__(self, grads):
        self.grads = grads

    def step(self, params, local, shards: list) -> dict:
        import ray

        refs = [h.pull_rows.remote(wire, True) for h, wire in shards]
        pulled = ray.get(refs)
        ray.get([h.push_rows.remote(wire, rows) for (h, wire), rows in zip(shards, pulled)])
        return self.grads


def bench_floor(steps: int, batch: int) -> dict:
    """Ray's messaging floor of an async PS step (2 workers, dlrm_kaggle, B = `batch`): box
    CPU ms per worker step over the middle half of `steps` steps; the messages as a Ray
    async-PS step sends them (`RayWorker.compute`, `ComputeServer.step`), built from a real
    batch of the config: its localized batch, the real ids per shard (`wire_rows`), their
    rows (`pack_rows`), the dense params as numpy. No training run (a threaded `Runtime`
    only builds the messages), so not through `algorithms.run`: the actors run on an
    instance of their own (`_local_ray`)."""
    import jax
    import ray

    from algorithms.runtime import ray_wire
    from algorithms.runtime.engine import Runtime

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors' classes
    cfg = bench_config("threads", 2, 8, batch)
    rt = Runtime(cfg, 2)
    try:
        local, rows = rt.warm_batch
        real = ray_wire.pack_rows(rt.ps.pull(rows, admit=False), rows)
        params = jax.device_get(rt.init_state.params)
        names = [[k for k, s in rt.ps.placement.items() if s == i] for i in range(len(rt.ps.shards))]
    finally:
        rt.close()
    with _local_ray():
        shards = [ray.remote(_FloorShard).options(max_concurrency=cfg.ray.ps_concurrency).remote(
            {k: real[k].shape for k in ns}) for ns in names if ns]
        wires = [ray_wire.wire_rows({k: rows[k] for k in ns}) for ns in names if ns]
        workers = [ray.remote(_FloorWorker).remote(params) for _ in range(2)]
        direct = list(zip(shards, wires))

        def call(w):
            return w.step.remote(params, local, direct)

        try:
            ray.get([call(w) for w in workers])  # start-up
            done, t = 0, {}
            with _busy_samples(0.05) as samples:
                pending = {call(w): w for w in workers}  # each worker's step in flight, as 2 roles
                while done < steps:
                    [ref], _ = ray.wait(list(pending))
                    w = pending.pop(ref)
                    ray.get(ref)
                    done += 1
                    t[done] = time.perf_counter()
                    pending[call(w)] = w
                ray.get(list(pending))
            lo, hi = t[steps // 4], t[3 * steps // 4]
            cores = _window(samples, lo, hi)
            per_step = (hi - lo) / (3 * steps // 4 - steps // 4)
        finally:
            for a in shards + workers:
                ray.kill(a)
    return {"busy_cores": cores, "cpu_ms_per_step": cores * per_step * 1e3,
            "steps_per_sec": 1.0 / per_step}


def bench_cpu(repeats: int, steps: int, batch: int) -> dict:
    """Box CPU ms per worker step: threads, Ray, and Ray's messaging floor, interleaved."""
    runs: dict[str, list[dict]] = {"threads": [], "ray": [], "floor": []}
    for r in range(repeats):
        for backend in ("threads", "ray"):
            runs[backend].append(_run_cpu(bench_config(backend, 2, steps, batch, seed=r)))
            print(f"  {backend}: {runs[backend][-1]}", file=sys.stderr, flush=True)
        runs["floor"].append(bench_floor(steps, batch))
        print(f"  floor: {runs['floor'][-1]}", file=sys.stderr, flush=True)

    def med(kind: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[kind])

    return {"name": "ray/cpu", "workers": 2, "batch_size": batch, "steps": steps,
            "model": "dlrm_kaggle", "repeats": repeats,
            **{f"{k}_cpu_ms_per_step_median": med(k, "cpu_ms_per_step") for k in runs},
            **{f"{k}_busy_cores_median": med(k, "busy_cores") for k in runs},
            "ratio_ray_to_threads_median": statistics.median(
                a["examples_per_sec"] / b["examples_per_sec"]
                for a, b in zip(runs["ray"], runs["threads"])), "all": runs}


def bench_ray(repeats: int = 5, quick: bool = False, batch: int = 4096) -> list[dict]:
    """Measurements 1-3; measurement 1 at B = `batch`, 200 steps (``quick``: B = 1024, 30)."""
    return [bench_call(512),
            bench_processes(repeats, 30, 1024) if quick else bench_processes(repeats, 200, batch),
            bench_scaling(repeats, 40 if quick else 100, 512, SCALING_FACTOR)]


def bench_memory(roles: tuple, workers: int = 2, steps: int = 8) -> dict:
    """Measurement 8 (``--memory``): the driver's peak resident memory in a dlrm_kaggle async
    run from the CLI, for each ``--ray.roles``: without ``--out``, with it (a checkpoint, which
    the shard actors write their tables into), and ``--resume`` of that run for 4 more steps
    (each shard actor reads its own tables); and each of its Ray processes' peak (sampled every
    0.1 s with psutil, the driver's own read from its VmHWM); one subprocess per run."""
    import tempfile

    out = {"name": "ray/memory", "config": "dlrm_kaggle", "workers": workers, "steps": steps}
    for ro in roles:
        with tempfile.TemporaryDirectory() as tmp:
            run = ["--out", str(pathlib.Path(tmp) / "run")]
            for key, extra in ((ro, []), (f"{ro} --out", run),
                               (f"{ro} --resume", [*run, "--resume", "--steps", str(steps + 4)])):
                hwm, peaks = _peaks(pathlib.Path(tmp) / "vmhwm", [
                    "--config", "dlrm_kaggle", "--algo", "async", "--backend", "ray",
                    "--trainers", str(workers), "--workers-per-trainer", "1", "--steps", str(steps),
                    "--ray.roles", ro, *extra])
                out[key] = {"driver_peak_mib": hwm / 1024,
                            "children_peak_mib": {k: v / 2**20 for k, v in sorted(peaks.items())}}
                print(f"  --ray.roles {key}: driver peak {hwm / 1024:.0f} MiB; "
                      + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in sorted(peaks.items())
                                  if v > 2**28), file=sys.stderr, flush=True)
    return out


def _peaks(hwm_file: pathlib.Path, args: list[str]) -> tuple[int, dict]:
    """Run ``scripts/train.py args`` in a subprocess: ``(its peak resident KiB, {child process
    name: its peak bytes})``."""
    import subprocess

    hwm_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _MEMORY_RUN, str(hwm_file), *args],
                            stdout=subprocess.DEVNULL)
    me, peaks = psutil.Process(proc.pid), {}
    while proc.poll() is None:
        try:
            for c in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    name = c.name()
                    peaks[name] = max(peaks.get(name, 0), c.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.1)
    hwm = int(hwm_file.read_text()) if hwm_file.exists() else 0
    if proc.returncode or not hwm:
        raise RuntimeError(f"the run {' '.join(args)} failed (exit {proc.returncode})")
    return hwm, peaks


# the CLI's run, then the process's peak resident memory (VmHWM, KiB) into the file argv[1]
_MEMORY_RUN = """import pathlib, sys
from algorithms.train_main import main
main(sys.argv[2:])
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
pathlib.Path(sys.argv[1]).write_text(hwm)
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--real", help="only measurement 4, at these worker counts (e.g. 1,2,4,8)")
    p.add_argument("--per-worker", type=int, default=16, help="--real: steps per worker")
    p.add_argument("--batch-size", type=int, default=4096,
                   help="one worker's batch size (measurements 1, 4, 5)")
    p.add_argument("--ps-shards", type=int, default=0, help="--real: PS shards (0: the config's)")
    p.add_argument("--algos", help=f"only measurement 5, for these algorithms ({','.join(ALGOS)}; "
                                   "shadow:RULE, fr:RULE with ShadowSync's --sync RULE)")
    p.add_argument("--steps", type=int, default=100, help="--algos, --cpu: steps per run")
    p.add_argument("--serial", action="store_true",
                   help="only measurement 7: S_W, c_W and the driver's CPU at 1 and 16 workers "
                        "(bench_ray_serial.py)")
    p.add_argument("--serial-algo", default="async", choices=("async", "gba", "persia"),
                   help="--serial: the algorithm (gba: its own mode, M = N = the workers; "
                        "persia: hybrid, the workers NN workers, half as many embedding "
                        "workers)")
    p.add_argument("--serial-workers", default="1,16",
                   help="--serial: the worker counts (the criteria compare the fewest and the "
                        "most; the driver's CPU is judged at each)")
    p.add_argument("--roles", default="auto",
                   help="--serial, --real, --algos, --memory: where the workers' roles run "
                        "under Ray (--ray.roles: auto, driver or actors); all but --real take "
                        "several, comma-separated, interleaved")
    p.add_argument("--chunk-s", type=float, default=0.0,
                   help="--serial: --ray.chunk_s of the runs (default: the config's, 0.5 s)")
    p.add_argument("--memory", action="store_true",
                   help="only measurement 8: the driver's peak memory, dlrm_kaggle, for each "
                        "--roles value")
    p.add_argument("--cpu", action="store_true",
                   help="only measurement 6: CPU per step, threads vs Ray vs Ray's floor")
    a = p.parse_args(argv)
    if bad := set(a.roles.split(",")) - {"auto", "driver", "actors"}:
        p.error(f"--roles: {', '.join(sorted(bad))} is not auto, driver or actors")
    if a.real and "," in a.roles:
        p.error("--real takes one --roles value")
    if a.algos:
        algos = [x.strip() for x in a.algos.split(",") if x.strip()]
        if unknown := sorted({x.partition(":")[0] for x in algos} - set(ALGOS)):
            p.error(f"--algos: {', '.join(unknown)} is not one of {', '.join(ALGOS)}")
        if bad := [x for x in algos if ":" in x and (x.partition(":")[0] not in ("shadow", "fr")
                                                     or x.partition(":")[2] not in SYNC_RULES)]:
            p.error(f"--algos: {', '.join(bad)}: a rule goes with shadow or fr only, one of "
                    f"{', '.join(SYNC_RULES)} (shadow:ma, fr:bmuf)")
        rows = [bench_algos(algos, a.repeats, a.steps, a.batch_size,
                            tuple(a.roles.split(",")))]
    elif a.serial:
        from algorithms.tools.bench_ray_serial import bench_serial

        config = {"gba": gba_serial_config, "persia": persia_serial_config}.get(
            a.serial_algo, bench_config)
        if a.chunk_s:
            config = functools.partial(with_chunk_s, config, a.chunk_s)
        rows = [{"algo": a.serial_algo, **r} for r in bench_serial(
            config, a.repeats, roles=tuple(a.roles.split(",")),
            workers=tuple(int(w) for w in a.serial_workers.split(",")))]
    elif a.cpu:
        rows = [bench_cpu(a.repeats, a.steps, a.batch_size)]
    elif a.memory:
        rows = [bench_memory(tuple(a.roles.split(",")))]
    elif a.real:
        rows = [bench_real(a.repeats, [int(w) for w in a.real.split(",")], a.per_worker,
                           a.batch_size, a.ps_shards, a.roles)]
    else:
        rows = bench_ray(a.repeats, a.quick, a.batch_size)
    for r in rows:
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("all")}))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
