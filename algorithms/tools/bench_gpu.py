"""DLRM training throughput on one accelerator, at several batch sizes: `python scripts/bench_gpu.py`.

    python scripts/bench_gpu.py --batch-sizes 4096,16384,65536 --repeats 7
    python scripts/bench_feed.py [--quick]    # the input pipeline vs staged (bench_feed.py)

The headline section of scripts/bench.py (DLRM, Criteo-Kaggle shape: 26 tables x0.5, D=16,
SGD, fp32, `--config dlrm_kaggle`) at the batch sizes given, on whatever device JAX uses by
default (a GPU when one is there). Per batch size, in one process, interleaved repeat by repeat:

* the plain-JAX reference (recjax/tools/bench_dlrm.py), the denominator of every ratio;
* recjax's step on pre-staged device batches, ``train.microbatches=1`` (what the default,
  auto, runs on a GPU) and ``train.microbatches=8`` (what auto runs on XLA:CPU at B=4096);
* recjax's step fed by its real input pipeline (synthetic Criteo-shaped stream -> batching ->
  prefetch thread -> device_put), microbatches=1;
* the input pipeline alone (the same prefetcher consumed with no train step): the host's
  ceiling for the previous row;
* PyTorch eager and torch.compile peers on the same device (recjax/tools/bench_torch.py with
  device=cuda), when torch is installed (and sees a GPU, if JAX runs on one).

The synthetic stream is generated per 65,536-row chunk and batches are slices of it, so the
pipeline's cost comes in bursts; by default a timed repeat spans at least 4 chunks (`--steps 0`:
max(20, 4 x 65,536 / B) steps). Each repeat runs 4 untimed steps first (this drains the prefetch
queue, which fills up while the other variants run and would otherwise hand the pipeline variant
4 free batches), then the timed steps, ending with a device sync. Reported: the median over
`--repeats` of examples/sec and its ratio to the in-run plain-JAX reference. JSON goes to `--out`.
"""

import os

# Leave room for the torch peers. Read when JAX first creates its GPU client (the first device
# use), not when jax is imported: importing the package above this module may import jax.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import itertools  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from algorithms.tools.bench import _recjax_runner, _reference_runner, _stream  # noqa: E402
from recjax import configs  # noqa: E402
from recjax.concurrency import Prefetcher  # noqa: E402
from recjax.data.pipeline import batches  # noqa: E402
from recjax.data.synthetic import SyntheticSource  # noqa: E402
from recjax.runlog import write_json_atomic  # noqa: E402
from recjax.tools import bench_dlrm, bench_torch  # noqa: E402
from recjax.train.data import data_workers  # noqa: E402

REF = "plain-JAX reference"
DRAIN = 4  # untimed steps before each timed repeat (= the prefetch depth)


def _pipeline_only_runner(src, batch_size, stream=_stream):
    """The input pipeline alone (no train step): ``(run(n): n batches onto the device,
    close)``; `stream` makes the batches of `src` (bench.py's synthetic stream by default)."""
    feed = Prefetcher(stream(src, batch_size), depth=4, transform=jax.device_put)

    def run(n):
        x = None
        for _ in range(n):
            x = next(feed)
        jax.block_until_ready(x)

    return run, feed.close


def _torch_device():
    if jax.default_backend() == "cpu":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else None


def set_precision(mode: str) -> dict:
    """Matmul precision of both frameworks; returns each one's measured matmul error.

    JAX's default on recent NVIDIA GPUs computes float32 dots with TF32 tensor cores; PyTorch's
    default is true float32. ``tf32`` puts both on TF32, ``fp32`` both on float32, ``default``
    leaves each framework's own default. The error is ||A B - ref|| / ||ref|| of a 1024^3
    float32 product against float64 on the host (TF32 ~1e-3/1e-4, float32 ~1e-7).
    """
    jax_mode = {"tf32": "tensorfloat32", "fp32": "float32"}.get(mode)
    if jax_mode:
        jax.config.update("jax_default_matmul_precision", jax_mode)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = lambda x: float(np.linalg.norm(np.asarray(x, np.float64) - ref) / np.linalg.norm(ref))
    out = {"precision": mode, "jax_matmul_rel_err": err(jax.jit(lambda x, y: x @ y)(a, b))}
    if bench_torch.available():
        import torch

        if mode != "default":
            torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
        dev = _torch_device() or "cpu"
        out["torch_matmul_rel_err"] = err(
            (torch.from_numpy(a).to(dev) @ torch.from_numpy(b).to(dev)).cpu().numpy())
    return out


def interleaved(runners: dict, steps: int, batch: int, repeats: int):
    """Warm up each runner, then per repeat: DRAIN untimed + `steps` timed steps of each."""
    compile_s = {}
    for k, (run, _) in list(runners.items()):
        t0 = time.perf_counter()
        try:
            run(2)
        except Exception:
            print(f"  {k}: failed in warm-up, dropped:\n{traceback.format_exc()}", flush=True)
            runners.pop(k)[1]()
            continue
        compile_s[k] = time.perf_counter() - t0
    rates = {k: [] for k in runners}
    cpu_ms = {k: [] for k in runners}
    for _ in range(repeats):
        for k, (run, _) in runners.items():
            run(DRAIN)
            t0, c0 = time.perf_counter(), time.process_time()
            run(steps)
            dt = time.perf_counter() - t0
            rates[k].append(steps * batch / dt)
            cpu_ms[k].append((time.process_time() - c0) / steps * 1e3)
    for _, close in runners.values():
        close()
    return rates, cpu_ms, compile_s


def one_batch_size(b: int, repeats: int, steps: int, peers: bool, variants=()) -> list[dict]:
    cfg = configs.dlrm_kaggle()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=b))
    src = SyntheticSource(cfg.synthetic, workers=data_workers(cfg))
    staged = [jax.device_put(x) for x, _ in itertools.islice(
        batches(src, b, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True), 8)]
    with_mb = lambda m: dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, microbatches=m))
    makers = {
        REF: lambda: _reference_runner(cfg, staged),
        "recjax, staged batches (microbatches=1)": lambda: _recjax_runner(
            with_mb(1), src, staged, pipeline=False),
        "recjax, real input pipeline (microbatches=1)": lambda: _recjax_runner(
            with_mb(1), src, staged, pipeline=True),
        "recjax, staged, microbatches=8 (bench.py's CPU setting)": lambda: _recjax_runner(
            with_mb(8), src, staged, pipeline=False),
        "input pipeline alone (no train step)": lambda: _pipeline_only_runner(src, b),
    }
    tdev = _torch_device() if peers and bench_torch.available() else None
    if tdev:
        mc = cfg.model
        args = (cfg.synthetic.cardinalities, cfg.synthetic.n_dense, mc.embed_dim, mc.bottom_mlp,
                mc.top_mlp, cfg.sparse.lr, staged)
        makers[f"PyTorch eager peer ({tdev})"] = lambda: bench_torch.make_runner(
            *args, device=tdev)
        makers[f"torch.compile peer ({tdev})"] = lambda: bench_torch.make_runner(
            *args, compiled=True, device=tdev)
    elif peers:
        print("  torch peers skipped: torch missing or sees no GPU", flush=True)
    if variants:
        makers = {k: v for k, v in makers.items()
                  if k == REF or any(x.lower() in k.lower() for x in variants)}
    runners = {}
    for k, make in makers.items():
        try:
            runners[k] = make()
        except Exception:
            print(f"  {k}: failed to build, dropped:\n{traceback.format_exc()}", flush=True)
    rates, cpu_ms, compile_s = interleaved(runners, steps, b, repeats)
    ref = float(np.median(rates[REF])) if REF in rates else float("nan")
    mc = cfg.model
    flops = bench_dlrm.flops_per_example(cfg.synthetic.n_dense, len(cfg.synthetic.cardinalities),
                                         mc.embed_dim, mc.bottom_mlp, mc.top_mlp)
    rows = []
    for k, v in rates.items():
        med = float(np.median(v))
        rows.append({"section": "dlrm_kaggle_gpu", "name": k, "batch_size": b, "median": med,
                     "examples_per_sec": v, "ratio_to_reference": med / ref,
                     "ms_per_step": b / med * 1e3, "gflops": med * flops / 1e9,
                     "host_cpu_ms_per_step": float(np.median(cpu_ms[k])),
                     "warmup_s": compile_s[k], "repeats": repeats, "steps_per_repeat": steps})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="4096,16384,65536")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=0,
                   help="timed steps per repeat; 0 = max(20, 4 synthetic chunks of 65,536 rows)")
    p.add_argument("--no-peers", action="store_true", help="skip the PyTorch peers")
    p.add_argument("--precision", choices=("default", "tf32", "fp32"), default="default",
                   help="float32 matmuls: each framework's default (JAX: TF32 on recent GPUs, "
                        "PyTorch: float32), both TF32, or both float32")
    p.add_argument("--variants", default="",
                   help="comma-separated substrings: keep only the variants whose name contains "
                        "one (the plain-JAX reference is always kept)")
    p.add_argument("--out", default="bench_results/bench_gpu.json")
    args = p.parse_args(argv)
    hw = {"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
          "jax": jax.__version__}
    if bench_torch.available():
        import torch

        hw["torch"] = torch.__version__
    hw.update(set_precision(args.precision))
    variants = tuple(x for x in args.variants.split(",") if x)
    print(f"hardware: {hw}", flush=True)
    rows = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        print(f"DLRM, Criteo-Kaggle shape (26 tables x0.5, D=16, SGD), B={b}, "
              f"precision={args.precision}:", flush=True)
        t0 = time.perf_counter()
        try:
            steps = args.steps or max(20, -(-4 * SyntheticSource.CHUNK // b))
            got = one_batch_size(b, args.repeats, steps, peers=not args.no_peers,
                                 variants=variants)
        except Exception:
            print(f"  B={b} failed:\n{traceback.format_exc()}", flush=True)
            got = []
        for r in got:
            print(f"  {r['name']:46s} {r['median']:12,.0f} ex/s  x{r['ratio_to_reference']:.2f} "
                  f"of reference  {r['ms_per_step']:7.2f} ms/step  host CPU "
                  f"{r['host_cpu_ms_per_step']:6.1f} ms/step  warm-up {r['warmup_s']:.1f} s  "
                  f"[{' '.join(f'{x / 1e3:.0f}K' for x in r['examples_per_sec'])}]", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
        rows += got
        gc.collect()
        write_json_atomic(args.out, {"hardware": hw, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
