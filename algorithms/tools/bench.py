"""Training throughput: `python scripts/bench.py [--quick] [--repeats 5] [--out FILE]`.

Prints tables and writes JSON (default bench_results/bench.json). Every comparison is made in
one process with the variants interleaved repeat by repeat, and reported as medians and ratios
to an in-run reference, because the machines are shared and noisy (docs/performance.md).

1. DLRM at the Criteo-Kaggle shape (PERF_NOTES): the plain-JAX reference step vs recjax's step
   on pre-staged device batches vs recjax fed by its real input pipeline (synthetic Criteo-shaped
   stream -> batching -> prefetch thread -> device_put); with two rows that are not DLRM steps:
   the model's MLP GEMMs alone (the ceiling GEMM speed puts on any implementation) and one big
   GEMM with a step's FLOPs (the roofline, measured on this machine rather than quoted).
2. Every model at two batch sizes (recjax, pre-staged batches); `models_seq`: DCN-v2 and DIN
   against plain-JAX references written from their papers, and the roofline
   (recjax/tools/bench_models_seq.py). With torch installed, the PyTorch eager and
   torch.compile peers of PERF_NOTES are measured in the same run (recjax/tools/bench_torch.py).
3. The SPMD (scripts/bench_spmd.py), host-async runtime (scripts/bench_runtime.py), GBA, LRU,
   Persia and Ray backend (scripts/bench_ray.py: Ray vs threads, scaling, one call's overhead)
   benchmarks; `clock` (scripts/bench_clock.py): the virtual clock's wall speed at 32 GBA
   workers and 16 ShadowSync trainers against the single trainer.
   `data` (recjax/tools/bench_data.py), only when named in --sections: text and Parquet to
   batches against pyarrow's own readers, on a generated 5M-row Criteo file.
4. `lru_store`: the dynamic-id embedding store (recjax/embeddings/dynamic.py) against a fixed
   numpy table, raw ids per second; for single-core wall rates run it alone under
   `taskset -c 0 python scripts/bench.py --sections lru_store`.
"""

import argparse
import dataclasses
import itertools
import os
import platform
import time

import jax
import numpy as np

from algorithms.tools import (
    bench_clock,
    bench_gba,
    bench_lru,
    bench_persia,
    bench_ray,
    bench_runtime,
)
from recjax import configs
from recjax.concurrency import Prefetcher
from recjax.data.hashing import mix64
from recjax.data.pipeline import batches
from recjax.data.synthetic import SyntheticSource
from recjax.embeddings import SparseOptimConfig, make_sparse_optimizer
from recjax.embeddings.dynamic import (
    LruStore,
    padded_rows,
    put_rows,
    unique_rows_update,
)
from recjax.models.config import MODEL_NAMES
from recjax.models.ops import dense_dot_general
from recjax.runlog import write_json_atomic
from recjax.tools import bench_data, bench_dlrm, bench_models_seq, bench_spmd, bench_torch
from recjax.train.data import data_workers
from recjax.train.setup import build
from recjax.train.step import jit_train_step, resolve_microbatches

# The sections measured by a benchmark of their own (each also a script: scripts/bench_NAME.py),
# in the order they run: ``bench_NAME(repeats, quick) -> list[dict]``.
SECTIONS = {"spmd": bench_spmd.bench_spmd, "runtime": bench_runtime.bench_runtime,
            "gba": bench_gba.bench_gba, "lru": bench_lru.bench_lru,
            "persia": bench_persia.bench_persia, "ray": bench_ray.bench_ray,
            "models_seq": bench_models_seq.bench_models_seq,
            "clock": bench_clock.bench_clock,
            "data": bench_data.bench_data}  # not in the default --sections: 1.2 GB of files


def _stream(src, batch_size):
    """Endless batches of the real pipeline, epoch after epoch."""
    for epoch in itertools.count():
        for b, _ in batches(src, batch_size, seed=0, epoch=epoch, shuffle_buffer=0,
                            drop_remainder=True):
            yield b


def _recjax_runner(cfg, src, staged, pipeline: bool):
    model, tx, sopt, state = build(cfg, src.spec)
    step = jit_train_step(model, tx, sopt)
    feed = (Prefetcher(_stream(src, cfg.train.batch_size), depth=4, transform=jax.device_put)
            if pipeline else itertools.cycle(staged))
    box = {"state": state}

    def run(n):
        s = box["state"]
        for _ in range(n):
            s, m = step(s, next(feed))
        jax.block_until_ready(m.loss)
        box["state"] = s

    return run, (feed.close if pipeline else (lambda: None))


def _reference_runner(cfg, staged):
    mc = cfg.model
    params, tables = bench_dlrm.init(cfg.synthetic.cardinalities, cfg.synthetic.n_dense,
                                     mc.embed_dim, mc.bottom_mlp, mc.top_mlp)
    step = bench_dlrm.make_step(cfg.sparse.lr)
    flat = [(b.dense, b.ids[:, :, 0], b.label) for b in staged]
    box = {"s": (params, tables)}

    def run(n):
        p, t = box["s"]
        for i in range(n):
            p, t, loss = step(p, t, *flat[i % len(flat)])
        jax.block_until_ready(loss)
        box["s"] = (p, t)

    return run, lambda: None


def interleaved(runners: dict, steps: int, batch: int, repeats: int) -> dict:
    """Warm up each runner, then time `steps` steps of each, round-robin, `repeats` times."""
    for run, _ in runners.values():
        run(2)
    rates = {k: [] for k in runners}
    cpu_eq = {k: [] for k in runners}
    for _ in range(repeats):
        for k, (run, _) in runners.items():
            t0, c0 = time.perf_counter(), time.process_time()
            run(steps)
            rates[k].append(steps * batch / (time.perf_counter() - t0))
            # Examples per second of this process's CPU time, times the cores: what the wall
            # rate would be with the machine to ourselves (robust to other jobs' load).
            cpu_eq[k].append(steps * batch / (time.process_time() - c0) * os.cpu_count())
    for _, close in runners.values():
        close()
    return rates, cpu_eq


ROOFLINE = "peak fp32 GEMM, a step's FLOPs (roofline)"


def _recjax_matmul(x, w):
    """``x @ w`` as recjax's MLP layers compute it and its gradients (`dense_dot_general`)."""
    return dense_dot_general(x, w, (((1,), (0,)), ((), ())))


def headline(repeats: int, steps: int, peers: bool) -> list[dict]:
    cfg = configs.dlrm_kaggle()
    b = cfg.train.batch_size
    src = SyntheticSource(cfg.synthetic, workers=data_workers(cfg))
    staged = [jax.device_put(x) for x, _ in itertools.islice(
        batches(src, b, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True), 8)]
    with_mb = lambda m: dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, microbatches=m))
    mb = resolve_microbatches(0, b)  # what the trainer's default (auto) runs
    mc = cfg.model
    flops = bench_dlrm.flops_per_example(cfg.synthetic.n_dense, len(cfg.synthetic.cardinalities),
                                         mc.embed_dim, mc.bottom_mlp, mc.top_mlp)
    runners = {
        "plain-JAX reference": _reference_runner(cfg, staged),
        "recjax, staged batches": _recjax_runner(with_mb(mb), src, staged, pipeline=False),
        "recjax, real input pipeline": _recjax_runner(with_mb(mb), src, staged, pipeline=True),
        "recjax, staged, microbatches=1": _recjax_runner(with_mb(1), src, staged, pipeline=False),
        # not a DLRM step: its GEMMs alone, the ceiling GEMM throughput puts on any step
        "MLP GEMMs only (ceiling)": bench_dlrm.make_gemm_ceiling(
            cfg.synthetic.n_dense, len(cfg.synthetic.cardinalities), cfg.model.embed_dim,
            cfg.model.bottom_mlp, cfg.model.top_mlp, b, b // mb, matmul=_recjax_matmul),
        # not a DLRM step: one big GEMM with a step's FLOPs, the roofline measured in this run
        ROOFLINE: bench_dlrm.make_peak_gemm(b, flops),
    }
    if peers and bench_torch.available():
        args = (cfg.synthetic.cardinalities, cfg.synthetic.n_dense, mc.embed_dim, mc.bottom_mlp,
                mc.top_mlp, cfg.sparse.lr, staged)
        dev = "cpu" if jax.default_backend() == "cpu" else "cuda"  # the device JAX measures on
        runners["PyTorch eager peer (EmbeddingBag sparse=True)"] = bench_torch.make_runner(
            *args, device=dev)
        runners["torch.compile peer"] = bench_torch.make_runner(*args, compiled=True, device=dev)
    rates, cpu_eq = interleaved(runners, steps, b, repeats)
    ref = np.median(rates["plain-JAX reference"])
    staged_med = np.median(rates["recjax, staged batches"])
    peak = np.median(rates[ROOFLINE])
    rows = []
    for k, v in rates.items():
        med = float(np.median(v))
        rows.append({"section": "dlrm_kaggle", "name": k, "batch_size": b, "median": med,
                     "examples_per_sec": v, "ratio_to_reference": med / ref,
                     "ratio_to_staged": med / staged_med, "ratio_to_roofline": med / peak,
                     "gflops": med * flops / 1e9,
                     "flops_per_example": flops, "repeats": repeats, "steps_per_repeat": steps,
                     "cpu_equivalent_median": float(np.median(cpu_eq[k])),
                     "cpu_equivalent": cpu_eq[k]})
    return rows


def per_model(repeats: int, steps: int, batch_sizes, models) -> list[dict]:
    rows = []
    for name, b in itertools.product(models, batch_sizes):
        cfg = configs.dlrm_kaggle()
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=name),
                                  train=dataclasses.replace(cfg.train, batch_size=b))
        src = SyntheticSource(cfg.synthetic, workers=data_workers(cfg))
        staged = [jax.device_put(x) for x, _ in itertools.islice(
            batches(src, b, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True), 4)]
        rates = interleaved({name: _recjax_runner(cfg, src, staged, False)}, steps, b, repeats)[0][name]
        rows.append({"section": "models", "name": name, "batch_size": b,
                     "median": float(np.median(rates)), "examples_per_sec": rates,
                     "repeats": repeats})
        print(f"  {name:10s} B={b:5d} {np.median(rates):10,.0f} ex/s", flush=True)
    return rows


LRU_ID_SPACE = 10_000_000  # possible raw ids of the lru_store section's stream


def _zipf_ids(rng: np.random.Generator, n: int, s: float = 1.05) -> np.ndarray:
    """n raw ids: Zipf(s) ranks out of LRU_ID_SPACE (continuous inverse CDF), mixed into 63 bits."""
    a = 1.0 - s
    ranks = (((LRU_ID_SPACE + 1.0) ** a - 1.0) * rng.random(n) + 1.0) ** (1.0 / a)
    return (mix64(ranks.astype(np.uint64)) >> np.uint64(1)).astype(np.int64)


def lru_store(repeats: int, quick: bool) -> list[dict]:
    """`LruStore` pull + push (adagrad) of Criteo-shaped batches vs a fixed numpy table.

    Batches of 4096 x 26 Zipf(1.05) raw ids out of 10M, ``np.unique``'d as the engine does (not
    timed); D = 16; a 2^20-row store warmed until it has evicted 2^18 rows, so every batch
    admits and evicts, each timed batch fresh. The fixed tables (2^20 rows) take the same batch
    hashed to rows (``mix64(id) mod 2^20``, unique'd). Rates are raw ids (4096 x 26 per batch) per
    second of wall clock and per CPU-second of this process (its single-core rate, whatever
    else runs on the machine); medians of `repeats`, the variants interleaved.
    """
    b, d, cap = 4096 * 26, 16, 1 << 20
    steps = 3 if quick else 5
    opt = make_sparse_optimizer(SparseOptimConfig("adagrad", lr=0.05))
    rng = np.random.default_rng(0)
    grads = (1e-3 * rng.standard_normal((b, d))).astype(np.float32)
    store = LruStore("emb/C", d, cap, opt, seed=0)
    step = 0
    while store.counters["evicted"] < cap // 4:
        ids = np.unique(_zipf_ids(rng, b))
        store.pull(ids)
        store.push(ids, grads[:ids.size], step)
        step += 1
    tables = {k: (rng.uniform(-1e-3, 1e-3, (cap, d)).astype(np.float32), np.zeros((cap, d), np.float32))
              for k in ("fixed", "shard")}
    rowwise, coalescing = unique_rows_update(opt), jax.jit(opt.update)

    def run_lru(batch, clock):
        for ids, _ in batch:
            t0 = time.perf_counter()
            store.pull(ids)
            t1 = time.perf_counter()
            store.push(ids, grads[:ids.size], step)
            clock["pull"] += t1 - t0
            clock["push"] += time.perf_counter() - t1

    def run_fixed(batch, clock):  # same row gathers/scatters and row-wise update as the store
        values, acc = tables["fixed"]
        for _, rows in batch:
            values.take(rows, axis=0)
            n, pad = rows.size, 1 << (rows.size - 1).bit_length()  # as the store pads
            w, a = rowwise(padded_rows(values, rows, pad), padded_rows(acc, rows, pad),
                           padded_rows(grads, np.arange(n), pad), np.int32(step))
            put_rows(values, rows, np.asarray(w)[:n])
            put_rows(acc, rows, np.asarray(a)[:n])

    def run_shard(batch, clock):  # algorithms/runtime/ps.py EmbeddingShard: ids padded to B x F
        values, acc = tables["shard"]
        local = np.arange(b, dtype=np.int32)
        for _, rows in batch:
            n = rows.size
            padded = np.full(b, cap, np.int64)
            padded[:n] = rows
            mini = values.take(padded, axis=0, mode="clip")
            g = np.zeros((b, d), np.float32)
            g[:n] = grads[:n]
            w, a = coalescing(mini, acc.take(padded, axis=0, mode="clip"),
                              np.where(local < n, local, b), g, np.int32(step))
            values[rows], acc[rows] = np.asarray(w)[:n], np.asarray(a)[:n]

    runners = {"LruStore (2^20 rows, evicting)": run_lru,
               "fixed table, same row-wise update": run_fixed,
               "fixed table, EmbeddingShard path": run_shard}
    for run in (run_fixed, run_shard):  # compile
        run([(None, np.arange(41_000))], {})
    wall = {k: [] for k in runners}
    cpu = {k: [] for k in runners}
    clock = {"pull": 0.0, "push": 0.0}
    uniq, evicted = [], store.counters["evicted"]
    for _ in range(repeats):
        batch = []
        for _ in range(steps):
            ids = np.unique(_zipf_ids(rng, b))
            batch.append((ids, np.unique(mix64(ids) & np.uint64(cap - 1)).astype(np.int64)))
            uniq.append(ids.size)
        for k, run in runners.items():
            t, c = time.perf_counter(), time.process_time()
            run(batch, clock)
            wall[k].append(steps * b / (time.perf_counter() - t))
            cpu[k].append(steps * b / (time.process_time() - c))
    timed = repeats * steps
    fixed = float(np.median(wall["fixed table, same row-wise update"]))
    return [{"section": "lru_store", "name": k, "median": float(np.median(v)), "ids_per_sec": v,
             "cpu_ids_per_sec_median": float(np.median(cpu[k])), "cpu_ids_per_sec": cpu[k],
             "ratio_to_fixed": float(np.median(v)) / fixed, "raw_ids_per_batch": b,
             "unique_ids_per_batch": float(np.mean(uniq)),
             "evicted_per_batch": (store.counters["evicted"] - evicted) / timed,
             "pull_ms": 1e3 * clock["pull"] / timed, "push_ms": 1e3 * clock["push"] / timed,
             "cores": len(os.sched_getaffinity(0)), "repeats": repeats, "batches_per_repeat": steps}
            for k, v in wall.items()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps, one batch size")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=0, help="steps per timed repeat")
    p.add_argument("--sections",
                   default="headline,models,models_seq,spmd,runtime,clock,gba,lru_store,lru,persia,"
                           "ray")
    p.add_argument("--no-peers", action="store_true",
                   help="skip the PyTorch peers (measured only when torch is installed)")
    p.add_argument("--out", default="bench_results/bench.json")
    args = p.parse_args(argv)
    steps = args.steps or (4 if args.quick else 12)
    sections = args.sections.split(",")
    hw = {"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
          "jax": jax.__version__}
    print(f"hardware: {hw}")
    rows = []
    if "headline" in sections:
        print("DLRM, Criteo-Kaggle shape (26 tables x0.5, D=16, B=4096, SGD):")
        rows += headline(args.repeats, steps, peers=not args.no_peers)
        for r in rows:
            print(f"  {r['name']:32s} {r['median']:10,.0f} ex/s  x{r['ratio_to_reference']:.2f} of "
                  f"reference  {r['ratio_to_staged']:.2f} of staged  "
                  f"{r['ratio_to_roofline']:.2f} of roofline  {r['gflops']:.0f} GFLOP/s  "
                  f"(cpu-equivalent {r['cpu_equivalent_median']:,.0f} ex/s)")
    if "models" in sections:
        print("every model, recjax, staged batches:")
        rows += per_model(args.repeats, steps, (4096,) if args.quick else (1024, 4096), MODEL_NAMES)
    for section, bench in SECTIONS.items():
        if section in sections:
            print(f"{section}:")
            got = bench(args.repeats, args.quick)
            for r in got:
                r.setdefault("section", section)
                r.setdefault("median", r.get("examples_per_sec_median", float("nan")))
                print(f"  {r['name']:40s} {r.get('median', float('nan')):10,.0f} ex/s  "
                      + " ".join(f"{k}={v:.3g}" for k, v in r.items() if k.startswith("ratio")))
            rows += got
    if "lru_store" in sections:
        print("lru_store: dynamic-id store vs fixed table, 4096 x 26 Zipf raw ids/batch, adagrad, D=16:")
        got = lru_store(args.repeats, args.quick)
        for r in got:
            print(f"  {r['name']:36s} {r['median'] / 1e6:6.2f} M ids/s  x{r['ratio_to_fixed']:.2f} of "
                  f"fixed  (per CPU-second {r['cpu_ids_per_sec_median'] / 1e6:.2f} M ids/s)")
        r = got[0]
        print(f"  {r['unique_ids_per_batch']:,.0f} unique ids and {r['evicted_per_batch']:,.0f} "
              f"evictions per batch; pull {r['pull_ms']:.1f} ms + push {r['push_ms']:.1f} ms; "
              f"{r['cores']} core(s) allowed")
        rows += got
    write_json_atomic(args.out, {"hardware": hw, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
