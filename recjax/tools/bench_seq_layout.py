"""Padded sequences (with a mask) against values + offsets, for DIN's attention pooling.

    python -m recjax.tools.bench_seq_layout [--batch 4096] [--max-len 20] [--repeats 7]
        [--models] [--out FILE.json]

``--batch`` and ``--max-len`` take comma lists (every pair is measured); ``--models`` also runs
recjax/tools/bench_models_seq.py's rows (DCN-v2, DIN, ...: recjax against a plain-JAX
reference and the roofline) at the first batch size, so one command measures both on a device;
``--out`` writes every row as JSON with the device, the jax version and the load average. The
GPU check of docs/models.md ("How a sequence is carried") is

    python -m recjax.tools.bench_seq_layout --batch 4096,32768 --max-len 20,100 --models \
        --out "${OUT:-bench_results}/seq_layout.json"

and the same with ``--batch 512 --max-len 20 --repeats 2 --quick`` runs on a CPU in minutes.

One jitted step of: the lookup of each behaviour's rows (S = 2 tables of width D, as the
synthetic teacher's item and category), then forward + backward of DIN's activation unit
(recjax/models/din.py, 36 PReLU units), the weighted sum (Eq. 3), a linear head and the logistic
loss, with gradients of the unit, the head and every looked-up row (the trainer's boundary; the
sparse update that scatters them is left out). Two layouts of the same sequences:

* padded: ids [B, L] and a mask, every position looked up and weighed (padding's rows are
  multiplied by 0), the layout recjax carries (recjax/models/sequence.py);
* jagged: the N real ids as values [N_cap] with segment ids (offsets), N_cap = N rounded up to
  a multiple of 1,024 (XLA needs a static shape; a run of batches would compile once per
  capacity), the unit on N_cap rows and a ``segment_sum`` to [B, K].

Lengths are drawn uniform in [1, L] (the teacher's; mean (L + 1) / 2) and geometric with mean
L / 5 (a skewed log, most sequences short). Repeats interleave the layouts; the table gives each
layout's median examples/s and the median of the per-repeat ratios jagged / padded.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from recjax.models.din import ActivationUnit
from recjax.runlog import write_json_atomic
from recjax.tools import bench_models_seq

S, D, V, HIDDEN = 2, 8, 100_000, (36,)


def _lengths(kind: str, b: int, max_len: int, rng) -> np.ndarray:
    if kind == "uniform":
        return rng.integers(1, max_len + 1, b)
    return np.minimum(rng.geometric(5.0 / max_len, b), max_len)


def _steps(b: int):
    unit = ActivationUnit(HIDDEN)
    k = S * D

    def head(v_u, q, w_out):
        return jnp.concatenate([v_u, q], 1) @ w_out

    def loss_padded(params, e, q, mask, label):
        e = e * mask[..., None]
        w = unit.apply({"params": params["att"]}, e, q)
        logit = head(jnp.einsum("bl,blk->bk", w, e), q, params["out"])[:, 0]
        return jnp.mean(jax.nn.softplus(logit) - logit * label)

    def loss_jagged(params, e, q, seg, label):
        w = unit.apply({"params": params["att"]}, e[:, None, :], q[jnp.minimum(seg, b - 1)])
        v_u = jax.ops.segment_sum(w * e, seg, num_segments=b)  # seg = b: capacity padding
        logit = head(v_u, q, params["out"])[:, 0]
        return jnp.mean(jax.nn.softplus(logit) - logit * label)

    def lookup(tables, ids):
        return jnp.concatenate([jnp.take(t, ids, axis=0) for t in tables], -1)

    def step(loss):
        # as the trainer: look the rows up, then gradients w.r.t. the params and the looked-up
        # rows (what row_gradients scatters), not a dense table-sized gradient
        def f(params, tables, ids, tgt, aux, label):
            e, q = lookup(tables, ids), lookup(tables, tgt)
            return jax.value_and_grad(loss, argnums=(0, 1, 2))(params, e, q, aux, label)
        return jax.jit(f)

    init = unit.init(jax.random.key(0), jnp.zeros((1, 1, k)), jnp.zeros((1, k)))["params"]
    params = {"att": init, "out": jnp.zeros((2 * k, 1))}
    return params, step(loss_padded), step(loss_jagged)


def run(batch: int, max_len: int, repeats: int, steps: int = 10) -> list[dict]:
    rng = np.random.default_rng(0)
    tables = [jnp.asarray(rng.normal(0, 0.1, (V, D)), jnp.float32) for _ in range(S)]
    rows = []
    for kind in ("uniform", "geometric"):
        lengths = _lengths(kind, batch, max_len, rng)
        n = int(lengths.sum())
        cap = -(-n // 1024) * 1024
        ids = rng.integers(0, V, (batch, max_len)).astype(np.int32)
        mask = (np.arange(max_len)[None, :] < lengths[:, None]).astype(np.float32)
        values = np.zeros(cap, np.int32)
        values[:n] = ids[mask > 0]
        seg = np.full(cap, batch, np.int32)
        seg[:n] = np.repeat(np.arange(batch), lengths)
        tgt = rng.integers(0, V, batch).astype(np.int32)
        label = (rng.random(batch) < 0.3).astype(np.float32)
        params, padded, jagged = _steps(batch)
        args = {"padded": (padded, (params, tables, ids, tgt, mask, label)),
                "jagged": (jagged, (params, tables, values, tgt, seg, label))}
        lp = float(padded(*args["padded"][1])[0])
        lj = float(jagged(*args["jagged"][1])[0])
        assert abs(lp - lj) < 1e-5 * max(1.0, abs(lp)), (lp, lj)  # the same sequences
        times = {name: [] for name in args}
        for _ in range(repeats):
            for name, (fn, a) in args.items():
                jax.block_until_ready(fn(*a))
                t = time.perf_counter()
                for _ in range(steps):
                    out = fn(*a)
                jax.block_until_ready(out)
                times[name].append((time.perf_counter() - t) / steps)
        ratio = np.median(np.array(times["padded"]) / np.array(times["jagged"]))
        rows.append({"lengths": kind, "mean_len": float(lengths.mean()), "max_len": max_len,
                     "batch": batch, "capacity": cap,
                     "padded_ex_s": batch / float(np.median(times["padded"])),
                     "jagged_ex_s": batch / float(np.median(times["jagged"])),
                     "jagged_over_padded": float(ratio)})
    return rows


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="4096", help="batch sizes, comma-separated")
    p.add_argument("--max-len", default="20", help="L, comma-separated")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    p.add_argument("--models", action="store_true",
                   help="also bench_models_seq's rows at the first batch size")
    p.add_argument("--quick", action="store_true", help="bench_models_seq's quick variant")
    p.add_argument("--out", default="", help="write the rows here as JSON")
    args = p.parse_args(argv)
    hw = {"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
          "jax": jax.__version__, "load_before": os.getloadavg()}
    print(hw, flush=True)
    layout = []
    for b in _ints(args.batch):
        for max_len in _ints(args.max_len):
            for r in run(b, max_len, args.repeats, args.steps):
                print(f"lengths {r['lengths']:9s} mean {r['mean_len']:5.2f} of L={r['max_len']}, "
                      f"B={r['batch']}: padded {r['padded_ex_s']:12,.0f} ex/s, jagged (capacity "
                      f"{r['capacity']}) {r['jagged_ex_s']:12,.0f} ex/s, jagged/padded speed "
                      f"x{r['jagged_over_padded']:.2f}", flush=True)
                layout.append(r)
    models = []
    if args.models:
        models = bench_models_seq.bench_models_seq(args.repeats, args.quick, _ints(args.batch)[0])
        for r in models:
            print(f"  {r['name']:52s} {r['median']:12,.0f} ex/s  x{r['ratio_to_reference']:.2f} "
                  f"of reference  {r['ratio_to_roofline']:.3f} of roofline  "
                  f"{r['gflops']:.1f} GFLOP/s", flush=True)
    hw["load_after"] = os.getloadavg()
    if args.out:
        write_json_atomic(args.out, {"hardware": hw, "layout": layout, "models": models})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
