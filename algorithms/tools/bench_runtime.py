"""Threaded-runtime overlap benchmark: is ShadowSync's sync really off the critical path?

    python scripts/bench_runtime.py [--repeats 5] [--quick]

Measures, in one process and interleaved per repeat (the host is small and noisy), the training
throughput (examples/sec over the timed, compiled part of each run) of the same n trainers x m
Hogwild workers (DLRM of the default config, B = 512, sync PS link of SYNC_GBPS) with:
S-EASGD (shadow threads), syncing switched off (``--sync none``), and
FR-EASGD with k = 1 (every worker iteration syncs in the foreground). Reports the median ratios
S-EASGD / none (ShadowSync's claim: ~1) and FR-EASGD(k=1) / none (< 1).
`bench_runtime(repeats, quick) -> list[dict]` is what scripts/bench.py calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics

from recjax import configs
from recjax.data.synthetic import PRESETS

# The sync PS link (emulated in threaded mode: held for bytes / bandwidth): one EASGD exchange of
# this model's dense params (2 x 74 KB) takes ~12 ms, about half a worker iteration, so syncing
# costs real time, as on a shared PS NIC (ShadowSync Sec. 4.2); embedding links stay at 10 Gbps.
SYNC_GBPS = 0.1
VARIANTS = {"s_easgd": ("shadow", "easgd"), "no_sync": ("shadow", "none"),
            "fr_easgd_k1": ("fr", "easgd")}


def bench_config(algo: str, sync: str, quick: bool, seed: int = 0):
    """DLRM (the default config's sizes) on synthetic data, 2 trainers x 2 workers, threaded."""
    c = configs.default()
    steps = 240 if quick else 480
    return dataclasses.replace(
        c, synthetic=dataclasses.replace(PRESETS["default"], n_train=steps * 512, n_eval=4096),
        train=dataclasses.replace(c.train, algo=algo, batch_size=512, steps=steps, seed=seed,
                                  progress=False, deterministic=False),
        runtime=dataclasses.replace(c.runtime, trainers=2, workers_per_trainer=2,
                                    sync_bandwidth_gbps=SYNC_GBPS),
        shadowsync=dataclasses.replace(c.shadowsync, sync=sync, sync_gap=1, alpha=0.5))


def bench_runtime(repeats: int = 5, quick: bool = False) -> list[dict]:
    """One row per variant: median examples/sec, its ratio to no-sync, and every repeat."""
    import algorithms

    runs: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    for r in range(repeats):
        for name, (algo, sync) in VARIANTS.items():
            s = algorithms.run(bench_config(algo, sync, quick, seed=r))
            runs[name].append({"examples_per_sec": s["examples_per_sec"],
                               "avg_sync_gap": s["avg_sync_gap"],
                               "syncs_per_sec": s["syncs_per_sec"]})
    base = [x["examples_per_sec"] for x in runs["no_sync"]]
    rows = []
    for name, xs in runs.items():
        eps = [x["examples_per_sec"] for x in xs]
        ratios = [a / b for a, b in zip(eps, base)]
        gaps = [x["avg_sync_gap"] for x in xs if x["avg_sync_gap"] is not None]
        rows.append({"name": f"runtime/{name}", "variant": name, "repeats": repeats,
                     "examples_per_sec_median": statistics.median(eps),
                     "ratio_to_no_sync_median": statistics.median(ratios),
                     "ratio_of_medians": statistics.median(eps) / statistics.median(base),
                     "avg_sync_gap_median": statistics.median(gaps) if gaps else None,
                     "examples_per_sec_all": eps, "trainers": 2, "workers_per_trainer": 2,
                     "batch_size": 512})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    rows = bench_runtime(args.repeats, args.quick)
    print(f"{'variant':<14}{'ex/s (median)':>16}{'/ no sync':>12}{'sync gap':>10}")
    for r in rows:
        gap = "-" if r["avg_sync_gap_median"] is None else f"{r['avg_sync_gap_median']:.2f}"
        print(f"{r['variant']:<14}{r['examples_per_sec_median']:>16,.0f}"
              f"{r['ratio_to_no_sync_median']:>12.3f}{gap:>10}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
