"""The host-async DLRM step with the dynamic-id LRU store vs fixed tables (Persia Sec. 4.2.2).

    python scripts/bench_lru.py [--repeats 5] [--quick]

One process, interleaved per repeat (the host is small and noisy): ``--algo async`` with one
trainer x one worker (the step cost, no overlap to hide it), DLRM of the default config on the
synthetic ``default`` preset (8 fields of 4 to 1,000 ids, Zipf), B = 4096, threaded clock,
with ``--embed.store fixed`` and ``--embed.store lru`` with 128 rows per table: fewer than the
250-1,000 ids of the three largest fields, so those tables evict and re-admit rows every step
(the counters are reported).
Reports examples/sec over the timed part of each run and the median of the per-repeat ratios
lru / fixed (target >= 0.8, issue "Persia ...").
`bench_lru(repeats, quick) -> list[dict]` is what scripts/bench.py calls (``--sections lru``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics

from recjax import configs
from recjax.data.synthetic import PRESETS

BATCH = 4096


def bench_config(store: str, quick: bool, seed: int = 0, capacity: int = 128):
    """DLRM (default sizes), one async worker, B = 4096, threaded; `store` fixed | lru."""
    c = configs.default()
    steps = 12 if quick else 30
    return dataclasses.replace(
        c, synthetic=dataclasses.replace(PRESETS["default"], n_train=(steps + 4) * BATCH,
                                         n_eval=4096),
        embed=dataclasses.replace(c.embed, store=store, capacity=capacity),
        sparse=dataclasses.replace(c.sparse, name="adagrad"),
        train=dataclasses.replace(c.train, algo="async", batch_size=BATCH, steps=steps,
                                  seed=seed, progress=False, deterministic=False),
        runtime=dataclasses.replace(c.runtime, trainers=1, workers_per_trainer=1, ps_shards=1,
                                    emulate_links=False))


def bench_lru(repeats: int = 5, quick: bool = False) -> list[dict]:
    """Rows for fixed and lru: median examples/sec, lru's ratio to fixed, LRU counters."""
    import algorithms

    runs: dict[str, list[dict]] = {"fixed": [], "lru": []}
    for r in range(repeats):
        for store in runs:
            s = algorithms.run(bench_config(store, quick, seed=r))
            runs[store].append({"examples_per_sec": s["segment_examples_per_sec"],
                                "lru": s.get("lru", {}).get("total")})
    base = [x["examples_per_sec"] for x in runs["fixed"]]
    rows = []
    for store, xs in runs.items():
        eps = [x["examples_per_sec"] for x in xs]
        rows.append({"name": f"lru/async_step_{store}", "store": store, "repeats": repeats,
                     "examples_per_sec_median": statistics.median(eps),
                     "ratio_to_fixed_median": statistics.median(
                         [a / b for a, b in zip(eps, base)]),
                     "examples_per_sec_all": eps, "batch_size": BATCH,
                     "lru_counters_last": xs[-1]["lru"]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    rows = bench_lru(args.repeats, args.quick)
    for r in rows:
        print(f"{r['store']:<6}{r['examples_per_sec_median']:>12,.0f} ex/s  "
              f"x{r['ratio_to_fixed_median']:.3f} of fixed  {r['lru_counters_last'] or ''}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
