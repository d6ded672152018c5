"""Does the input pipeline keep the accelerator busy? DLRM at B = 65,536, fed vs pre-staged.

    python scripts/bench_feed.py                        # on the GPU host: < 3 minutes
    JAX_PLATFORMS=cpu python scripts/bench_feed.py --quick     # a small run on a CPU

Issue 36's GPU-feed target: the real pipeline's examples/sec >= 0.8 of the same train step on
pre-staged device batches. One process, variants interleaved repeat by repeat
(`bench_gpu.interleaved`: warm-up, then per repeat 4 untimed and ``--steps`` timed steps each):

* **Parquet** (the loader of real data): a Criteo-shaped dataset the benchmark writes once
  (``--rows`` rows: a TSV made by `recjax.tools.bench_data.generate`, converted by
  `recjax.data.convert`; kept in ``--workdir``), read as ``parquet:DIR`` hashed into
  ``--buckets`` per field, file order, the trainer's path (`batches` -> `Prefetcher` ->
  ``device_put``) with the row groups decoded on ``--workers`` threads
  (`ParquetSource.workers`, ``data.workers`` in a run). Rows: recjax's DLRM step on 8
  pre-staged batches of the same data; the step fed by the pipeline; the pipeline alone (no
  step: the host's ceiling). The model is ``--config dlrm_kaggle``'s (D = 16, bottom MLP
  13-512-256-64-16, top MLP 367-512-256-1, SGD) with the dataset's 26 hashed tables.
* **synthetic** (``--data synthetic:criteo``, what `bench_gpu` measures): the step on staged
  batches and fed by the generator on ``data.workers`` threads (``--workers``).

Prints each variant's median examples/sec, the ratio to its staged row (median of per-repeat
ratios) and host CPU ms per step; writes JSON to ``$OUT/bench_feed.json`` when ``$OUT`` is set,
else ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import platform
import shutil
import time

import jax
import numpy as np

from algorithms.tools.bench import _recjax_runner
from algorithms.tools.bench_gpu import _pipeline_only_runner, interleaved
from recjax import configs
from recjax.data.columnar import ParquetSource
from recjax.data.pipeline import batches
from recjax.data.synthetic import SyntheticSource
from recjax.runlog import write_json_atomic


def parquet_dataset(workdir: str, rows: int) -> str:
    """A converted Criteo-shaped dataset of `rows` rows in `workdir` (made once, kept)."""
    from recjax.data.convert import convert
    from recjax.tools.bench_data import generate

    os.makedirs(workdir, exist_ok=True)
    pq_dir = os.path.join(workdir, f"feed_{rows}.parquet")
    if os.path.exists(os.path.join(pq_dir, "manifest.json")):
        return pq_dir
    tsv = os.path.join(workdir, f"feed_{rows}.tsv")
    t = time.perf_counter()
    if not os.path.exists(tsv):
        generate(tsv, rows)
    shutil.rmtree(pq_dir, ignore_errors=True)
    convert([f"criteo:{tsv}"], pq_dir)
    os.remove(tsv)
    print(f"  wrote {pq_dir} ({rows:,} rows) in {time.perf_counter() - t:.0f} s", flush=True)
    return pq_dir


def _epochs(src, b: int):
    for epoch in itertools.count():
        for batch, _ in batches(src, b, seed=0, epoch=epoch, shuffle_buffer=0,
                                drop_remainder=True):
            yield batch


def _staged(src, b: int, n: int = 8) -> list:
    return [jax.device_put(x) for x in itertools.islice(_epochs(src, b), n)]


def feed(b: int, repeats: int, steps: int, rows: int, workers: int, buckets: int,
         workdir: str, synthetic: bool = True) -> list[dict]:
    """The rows of the measurement (module docstring)."""
    cfg = configs.dlrm_kaggle()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=b,
                                                             microbatches=1))
    pq_dir = parquet_dataset(workdir, rows)
    pq = lambda: ParquetSource(pq_dir, hash_buckets=buckets, workers=workers)  # noqa: E731
    staged_pq = _staged(pq(), b)
    makers = {
        "parquet: staged batches": lambda: _recjax_runner(cfg, pq(), staged_pq, pipeline=False),
        f"parquet: real pipeline ({workers} threads)": lambda: _recjax_runner(
            cfg, pq(), staged_pq, pipeline=True),
        f"parquet: pipeline alone ({workers} threads)": lambda: _pipeline_only_runner(pq(), b, _epochs),
    }
    refs = {k: "parquet: staged batches" for k in makers}
    if synthetic:
        syn = lambda: SyntheticSource(cfg.synthetic, workers=workers)  # noqa: E731
        staged_syn = _staged(syn(), b)
        makers["synthetic: staged batches"] = lambda: _recjax_runner(cfg, syn(), staged_syn,
                                                                     pipeline=False)
        makers[f"synthetic: real pipeline ({workers} threads)"] = lambda: _recjax_runner(
            cfg, syn(), staged_syn, pipeline=True)
        refs.update({k: "synthetic: staged batches" for k in makers if k.startswith("synth")})
    runners = {k: make() for k, make in makers.items()}
    rates, cpu_ms, warm = interleaved(runners, steps, b, repeats)
    out = []
    for k, v in rates.items():
        ratio = np.array(v) / np.array(rates[refs[k]])
        out.append({"section": "feed", "name": k, "batch_size": b, "median": float(np.median(v)),
                    "examples_per_sec": v, "ratio_to_staged": float(np.median(ratio)),
                    "staged": refs[k], "host_cpu_ms_per_step": float(np.median(cpu_ms[k])),
                    "warmup_s": warm[k], "repeats": repeats, "steps_per_repeat": steps,
                    "workers": workers, "rows": rows, "hash_buckets": buckets})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a size for a CPU")
    p.add_argument("--batch-size", type=int, default=0, help="0: 65,536 (--quick: 4,096)")
    p.add_argument("--rows", type=int, default=0,
                   help="rows of the Parquet dataset; 0: 1,048,576 (--quick: 131,072)")
    p.add_argument("--buckets", type=int, default=0,
                   help="hash buckets per field; 0: 2^20 (--quick: 2^14)")
    p.add_argument("--workers", type=int, default=0,
                   help="reader / generator threads; 0: half the cores, at most 8")
    p.add_argument("--repeats", type=int, default=0, help="0: 7 (--quick: 3)")
    p.add_argument("--steps", type=int, default=0, help="timed steps per repeat; 0: 20 "
                   "(--quick: 16), well above the prefetch depth of 4")
    p.add_argument("--workdir", default=os.path.join("bench_results", "feed_data"),
                   help="where the generated dataset is kept")
    p.add_argument("--out", default=os.path.join("bench_results", "bench_feed.json"),
                   help="the JSON, when $OUT is not set")
    args = p.parse_args(argv)
    quick = args.quick
    b = args.batch_size or (4096 if quick else 65536)
    rows = args.rows or (2 * 65536 if quick else 1 << 20)
    buckets = args.buckets or (1 << 14 if quick else 1 << 20)
    workers = args.workers or max(1, min(8, (os.cpu_count() or 2) // 2))
    steps = args.steps or (16 if quick else 20)
    repeats = args.repeats or (3 if quick else 7)
    hw = {"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
          "jax": jax.__version__, "load_before": os.getloadavg()}
    print(f"hardware: {hw}", flush=True)
    print(f"DLRM (dlrm_kaggle shape), B={b}, {repeats} repeats x {steps} steps, {workers} "
          f"reader threads, {rows:,}-row Parquet, {buckets} buckets per field:", flush=True)
    t0 = time.perf_counter()
    got = feed(b, repeats, steps, rows, workers, buckets, args.workdir)
    hw["load_after"] = os.getloadavg()
    for r in got:
        print(f"  {r['name']:40s} {r['median']:13,.0f} ex/s  x{r['ratio_to_staged']:.2f} of "
              f"{r['staged']:26s} host CPU {r['host_cpu_ms_per_step']:7.1f} ms/step  "
              f"[{' '.join(f'{x / 1e3:.0f}K' for x in r['examples_per_sec'])}]", flush=True)
    print(f"  ({time.perf_counter() - t0:.0f} s; load after {hw['load_after']})")
    path = (os.path.join(os.environ["OUT"], "bench_feed.json") if os.environ.get("OUT")
            else args.out)
    write_json_atomic(path, {"hardware": hw, "rows": got})
    print(f"wrote {path}")
    return 0
