"""Ray backend benchmark: the price of processes, the engine's scaling, one call's overhead.

    python scripts/bench_ray.py [--repeats 5] [--quick] [--json FILE]

The measurements, in one process and on one local Ray instance (started once; its start and
each run's actor start and compile are outside the timed part, which is the roles' run):

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
`bench_ray(repeats, quick) -> list[dict]` is what scripts/bench.py calls.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax import configs  # noqa: E402
from recjax.config import RayConfig  # noqa: E402
from recjax.data.synthetic import PRESETS  # noqa: E402

ALGOS = ("async", "shadow", "fr", "gba", "persia")
# Measurement 2's slowdown. A straggler sleeps (F - 1) x its measured gradient computation
# (`clock.Work.measured`), about 2.5 ms at B = 512 on the default model, against about 20 ms a
# step spends in Ray calls: F = 50 makes about 90% of a step modelled time.
SCALING_FACTOR = 50.0


def bench_config(backend: str, workers: int, steps: int, batch: int, stragglers: str = "none",
                 model: str = "dlrm_kaggle", seed: int = 0):
    """Async PS, `workers` workers, on synthetic data (enough for `steps` steps)."""
    c = configs.CONFIGS[model]()
    preset = "criteo" if model == "dlrm_kaggle" else "default"
    return dataclasses.replace(
        c, synthetic=dataclasses.replace(PRESETS[preset], n_train=(steps + 8) * batch,
                                         n_eval=2048),
        data=dataclasses.replace(c.data, shuffle_buffer=0, prefetch=4),
        train=dataclasses.replace(c.train, algo="async", batch_size=batch, steps=steps,
                                  seed=seed, progress=False, deterministic=False,
                                  eval_batch_size=2048),
        runtime=dataclasses.replace(c.runtime, trainers=workers, workers_per_trainer=1,
                                    stragglers=stragglers, backend=backend),
        ray=dataclasses.replace(c.ray, snapshot_every=1_000_000))


def algo_config(algo: str, backend: str, steps: int, batch: int, seed: int = 0):
    """`bench_config` with 2 workers of `batch` rows each, as `algo` runs them (measurement 5).

    GBA and Persia count a step as one global batch of both workers' rows (2 x `batch`)."""
    k = 2 if algo in ("gba", "persia") else 1  # worker batches per step
    c = bench_config(backend, 2, steps * k, batch, seed=seed)
    c = dataclasses.replace(c, train=dataclasses.replace(
        c.train, algo=algo, steps=steps, batch_size=batch * k))
    if algo == "gba":
        c = dataclasses.replace(c, gba=dataclasses.replace(c.gba, mode="gba", workers=2,
                                                           local_batch_size=batch))
    if algo == "persia":
        c = dataclasses.replace(c, persia=dataclasses.replace(
            c.persia, mode="hybrid", nn_workers=2, embedding_workers=2))
    return c


@contextlib.contextmanager
def _local_ray():
    """One local Ray instance for every run inside (each run joins it), stopped after."""
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


def _eps(cfg) -> float:
    from algorithms import RUNNERS

    t = time.perf_counter()
    eps = RUNNERS[cfg.train.algo](cfg)["segment_examples_per_sec"]
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
               shards: int = 0) -> dict:
    """Ray worker processes with real compute: examples/sec at each W and its speedup over 1."""
    eps: dict[int, list[float]] = {w: [] for w in workers}
    for r in range(repeats):
        for w in workers:
            cfg = bench_config("ray", w, per_worker * w, batch, seed=r)
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


def bench_algos(algos: list[str], repeats: int, steps: int, batch: int) -> dict:
    """Each algorithm, threads vs Ray, 2 workers: examples/sec and the median ratio."""
    runs = {a: {"threads": [], "ray": []} for a in algos}
    for r in range(repeats):
        for a in algos:
            for backend in ("threads", "ray"):
                runs[a][backend].append(_eps(algo_config(a, backend, steps, batch, seed=r)))
    return {"name": "ray/algos", "workers": 2, "worker_batch_size": batch, "steps": steps,
            "model": "dlrm_kaggle", "repeats": repeats, **{a: _versus(v) for a, v in runs.items()}}


def bench_call(batch: int, n: int = 50) -> dict:
    """One pull and one push through a shard actor vs the same shard in this process."""
    import jax

    from algorithms.runtime import ray_backend
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
            ids_bytes = sum(real.nbytes for real, _, _ in ray_backend.wire_rows(rows).values())
            real = ray_backend.pack_rows(minis, rows)
            out["worker_actor_pull_bytes"] = int(sum(v.nbytes for v in real.values()) + ids_bytes)
            out["worker_actor_push_bytes"] = out["worker_actor_pull_bytes"]
        finally:
            rt.close()
    return out


def bench_ray(repeats: int = 5, quick: bool = False, batch: int = 4096) -> list[dict]:
    """Measurements 1-3; measurement 1 at B = `batch`, 200 steps (``quick``: B = 1024, 30)."""
    with _local_ray():
        return [bench_call(512),
                bench_processes(repeats, 30, 1024) if quick
                else bench_processes(repeats, 200, batch),
                bench_scaling(repeats, 40 if quick else 100, 512, SCALING_FACTOR)]


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
    p.add_argument("--algos", help=f"only measurement 5, for these algorithms ({','.join(ALGOS)})")
    p.add_argument("--steps", type=int, default=100, help="--algos: steps per run")
    a = p.parse_args(argv)
    if a.algos:
        algos = [x.strip() for x in a.algos.split(",") if x.strip()]
        if unknown := sorted(set(algos) - set(ALGOS)):
            p.error(f"--algos: {', '.join(unknown)} is not one of {', '.join(ALGOS)}")
        with _local_ray():
            rows = [bench_algos(algos, a.repeats, a.steps, a.batch_size)]
    elif a.real:
        with _local_ray():
            rows = [bench_real(a.repeats, [int(w) for w in a.real.split(",")], a.per_worker,
                               a.batch_size, a.ps_shards)]
    else:
        rows = bench_ray(a.repeats, a.quick, a.batch_size)
    for r in rows:
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("all")}))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
