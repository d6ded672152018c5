"""Persia's three modes (hybrid, sync, async) under an embedding straggler: throughput in one run.

    python scripts/bench_persia.py [--repeats 5] [--steps 600] [--out runs/bench_persia.json]

One setting for all three ``--persia.mode`` values: DLRM of the default config (8 tables,
D = 16) on synthetic:default, global batch 512 = 2 NN workers x 256, 4 embedding workers,
tau = 8, embedding worker stragglers ``slow:k=1,factor=4`` (one embedding worker, chosen by
the seed, 4x slower in its lookups and gradient puts: in threads it sleeps 3x its measured
compute, so the 2-core box measures the schedule, not a second machine). Threads
(``train.deterministic=False``, wall clock) are repeated ``--repeats`` times interleaved
(hybrid, sync, async, hybrid, ...), each repeat with its own seed; the virtual clock
(``--deterministic``, modelled costs: ``runtime.example_cost_us`` per NN example,
``persia.embedding_cost_us`` per looked-up id) once per seed of ``--virtual-repeats``. The rows
give the median examples/s and the median of the per-repeat ratios hybrid/sync and
hybrid/async (the paper, Sec. 6.3: hybrid much faster than sync, async 1.2x hybrid at most).
`bench_persia(repeats, quick) -> list[dict]` is what scripts/bench.py calls.

Each run goes through `algorithms.run` (its checks, and no Ray process outliving it). It also
times each jitted piece and host step of one global step on its own (`per_call_costs`, main
thread, no contention: pieces of one role, no training run, so built directly) and reports every
run's ``dense_allreduce_seconds`` (threads: wall an NN worker spent in the all-reduce, barrier
wait included) and the process CPU time during the roles (``cpu_cores_busy`` = CPU seconds /
wall seconds: 2.0 is both cores saturated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository: runs/ by default
MODES = ("hybrid", "sync", "async")
STRAGGLERS = "slow:k=1,factor=4"
NN, EMB, TAU, BATCH = 2, 4, 8, 512


def bench_config(mode: str, clock: str, steps: int, seed: int = 0, stragglers: str = STRAGGLERS,
                 batch: int = BATCH, emb: int = EMB, tau: int = TAU):
    from recjax import configs
    from recjax.data.synthetic import PRESETS

    c = configs.default()
    return dataclasses.replace(
        c, synthetic=dataclasses.replace(PRESETS["default"], n_train=steps * batch, n_eval=4096),
        train=dataclasses.replace(c.train, algo="persia", batch_size=batch, steps=steps, seed=seed,
                                  progress=False, deterministic=clock == "virtual"),
        persia=dataclasses.replace(c.persia, mode=mode, nn_workers=NN, embedding_workers=emb,
                                   staleness=tau, embedding_stragglers=stragglers))


def timed_run(cfg) -> dict:
    """One Persia run; the numbers kept, with the process CPU time spent while the roles ran."""
    import algorithms
    from algorithms.tools import roles

    with roles.timed() as run:
        s = algorithms.run(cfg)
    return {"examples_per_sec": s["examples_per_sec"], "seconds": s["segment_seconds"],
            "cpu_cores_busy": run["cpu_seconds"] / s["segment_seconds"] if not cfg.train.deterministic
            else None, "dense_allreduce_seconds": s["dense_allreduce_seconds"],
            "embedding_staleness_mean": s["embedding_staleness"]["mean"],
            "embedding_staleness_max": s["embedding_staleness"]["max"], "eval_auc": s["eval_auc"]}


def per_call_costs(calls: int = 30) -> dict[str, float]:
    """Median seconds of each piece of one global step, called alone in the main thread (the
    pieces of a `persia.Persia` built directly: no training run, so not `algorithms.run`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from algorithms import persia
    from algorithms.persia_roles import slice_of
    from algorithms.runtime import Runtime
    from algorithms.runtime.ps import localize
    from recjax.train.step import apply_dense

    cfg = bench_config("hybrid", "threads", 64)
    p = persia.Persia(Runtime(cfg, persia.plan(cfg).nn_workers))
    rt, codec, k = p.rt, p.codec, p.p.nn_workers
    batch = rt.feed.first(1)[0]
    local, rows = localize(rt.model.layout, batch)
    minis = rt.ps.pull(rows)
    acts = jax.block_until_ready(p.emb_lookup(minis, local.ids, local.mask))
    sl = slice_of(acts, batch, 0, p.p.local_batch)
    _, g_params, g_acts = jax.block_until_ready(p.nn_grads[0](p.dense.params, *sl))
    full = {g: jnp.concatenate([v] * k) for g, v in g_acts.items()}
    row_g = jax.block_until_ready(p.row_grads(full, local.ids, local.mask))
    # what the all-reduce would cost as one jitted call (mean in party order + optimizer step)
    fused = jax.jit(lambda prm, o, *gs: apply_dense(rt.tx, prm, o, jax.tree.map(
        lambda *xs: sum(xs[1:], xs[0]) * np.float32(1.0 / len(xs)), *gs)))
    dense = p.dense
    pieces = {
        f"ids codec (send + recv, {codec.kind})": lambda: codec.recv_ids(codec.send_ids(batch.ids)[0]),
        "localize (np.unique per table)": lambda: localize(rt.model.layout, batch),
        "ps pull (np.take)": lambda: rt.ps.pull(rows),
        "embedding lookup (jit, B rows)": lambda: jax.block_until_ready(
            p.emb_lookup(minis, local.ids, local.mask)),
        "acts to host, K slices": lambda: [codec.send_values(np.asarray(a))
                                           for j in range(k)
                                           for a in slice_of(acts, batch, j, p.p.local_batch)[0].values()],
        "nn forward/backward (jit, B/K rows)": lambda: jax.block_until_ready(
            p.nn_grads[0](p.dense.params, *sl)),
        "act grads to host": lambda: [codec.send_values(np.asarray(a)) for a in g_acts.values()],
        "all-reduce mean + dense apply (jit)": lambda: jax.block_until_ready(
            p.dense._reduce([g_params] * k)),
        "(same, fused into one jit: not used)": lambda: jax.block_until_ready(
            fused(dense.params, dense.opt_state, *[g_params] * k)),
        "row gradients (jit, B rows)": lambda: jax.block_until_ready(
            p.row_grads(full, local.ids, local.mask)),
        "ps push (sparse optimizer, write back)": lambda: rt.ps.push(rows, row_g),
    }
    out = {}
    for name, fn in pieces.items():
        fn()
        ts = []
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        out[name] = statistics.median(ts)
    return out


def bench_persia(repeats: int = 5, quick: bool = False) -> list[dict]:
    """The rows of `measure` (300 steps per run if `quick`, else 600); what scripts/bench.py
    calls (``--sections persia``)."""
    return measure(repeats, 300 if quick else 600, log=lambda s: None)["rows"]


def measure(repeats: int = 5, steps: int = 600, virtual_repeats: int = 1,
            stragglers: str = STRAGGLERS, log=print) -> dict:
    """Interleaved threaded repeats and virtual-clock runs; medians and per-repeat ratios."""
    runs: dict[str, dict[str, list[dict]]] = {c: {m: [] for m in MODES} for c in ("threads", "virtual")}
    timed_run(bench_config("hybrid", "threads", 64, seed=99, stragglers=stragglers))  # warm-up
    for clock, n in (("threads", repeats), ("virtual", virtual_repeats)):
        for r in range(n):
            for mode in MODES:
                x = timed_run(bench_config(mode, clock, steps, seed=r, stragglers=stragglers))
                runs[clock][mode].append(x)
                log(f"  {clock:<8} repeat {r} {mode:<7} {x['examples_per_sec']:>9,.0f} ex/s "
                    f"({x['seconds']:.2f} s, all-reduce {x['dense_allreduce_seconds']:.2f} s"
                    + (f", {x['cpu_cores_busy']:.2f} cores busy" if x["cpu_cores_busy"] else "")
                    + ")")
    rows = []
    for clock, by_mode in runs.items():
        for mode, xs in by_mode.items():
            if not xs:
                continue
            eps = [x["examples_per_sec"] for x in xs]
            ratio = {b: statistics.median(a / y["examples_per_sec"] for a, y in zip(eps, by_mode[b]))
                     for b in MODES}
            busy = [x["cpu_cores_busy"] for x in xs if x["cpu_cores_busy"] is not None]
            rows.append({"name": f"persia/{clock}/{mode}", "clock": clock, "mode": mode,
                         "repeats": len(xs), "stragglers": stragglers, "steps": steps,
                         "examples_per_sec_median": statistics.median(eps),
                         "examples_per_sec_all": eps, "seconds_median": statistics.median(
                             x["seconds"] for x in xs),
                         "ratio_to_sync_median": ratio["sync"], "ratio_to_async_median": ratio["async"],
                         "ratio_to_hybrid_median": ratio["hybrid"],
                         "dense_allreduce_seconds_median": statistics.median(
                             x["dense_allreduce_seconds"] for x in xs),
                         "cpu_cores_busy_median": statistics.median(busy) if busy else None,
                         "embedding_staleness_mean": xs[0]["embedding_staleness_mean"],
                         "embedding_staleness_max": max(x["embedding_staleness_max"] for x in xs)})
    return {"rows": rows, "runs": runs}


def _enable_compile_cache(directory: pathlib.Path) -> None:
    """Every run rebuilds its jitted pieces; the persistent cache makes the rebuilds loads."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="threaded repeats (interleaved)")
    p.add_argument("--virtual-repeats", type=int, default=1, help="virtual-clock seeds")
    p.add_argument("--steps", type=int, default=600, help="global steps per run")
    p.add_argument("--stragglers", default=STRAGGLERS, help="persia.embedding_stragglers")
    p.add_argument("--out", default=str(ROOT / "runs" / "bench_persia.json"), help="JSON file")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _enable_compile_cache(out.parent / "jax_cache")
    t0 = time.perf_counter()
    costs = per_call_costs()
    print("per-call costs (median of 30, main thread alone):")
    for name, s in costs.items():
        print(f"  {name:<40}{s * 1e3:>8.2f} ms")
    used = sum(v for k, v in costs.items() if "not used" not in k)
    print(f"  {'sum (one global step in sequence)':<40}{used * 1e3:>8.2f} ms")
    res = measure(args.repeats, args.steps, args.virtual_repeats, args.stragglers)
    print(f"\nembedding stragglers {args.stragglers}, {NN} NN workers x {BATCH // NN} rows, {EMB} "
          f"embedding workers, tau {TAU}, {args.steps} steps of {BATCH}; median of {args.repeats} "
          f"(threads), {args.virtual_repeats} (virtual)")
    print(f"{'clock':<9}{'mode':<8}{'ex/s':>10}{'/ sync':>8}{'/ async':>8}{'/ hybrid':>9}"
          f"{'all-reduce s':>14}{'cores busy':>12}{'staleness':>11}")
    for r in res["rows"]:
        busy = r["cpu_cores_busy_median"]
        print(f"{r['clock']:<9}{r['mode']:<8}{r['examples_per_sec_median']:>10,.0f}"
              f"{r['ratio_to_sync_median']:>8.2f}{r['ratio_to_async_median']:>8.2f}"
              f"{r['ratio_to_hybrid_median']:>9.2f}{r['dense_allreduce_seconds_median']:>14.3f}"
              f"{'-' if busy is None else f'{busy:.2f}':>12}"
              f"{r['embedding_staleness_mean']:>7.2f} ({r['embedding_staleness_max']})")
    meta = {"command": " ".join(["python scripts/bench_persia.py"] + argv),
            "secs": time.perf_counter() - t0, "stragglers": args.stragglers, "nn_workers": NN,
            "embedding_workers": EMB, "tau": TAU, "global_batch": BATCH, "steps": args.steps}
    out.write_text(json.dumps({"meta": meta, "per_call_seconds": costs, **res}, indent=1))
    print(f"wrote {out} ({meta['secs']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
