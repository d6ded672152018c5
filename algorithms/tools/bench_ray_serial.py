"""Ray backend benchmark, measurement 7 (``python scripts/bench_ray.py --serial``): is there a
serial part, and does the CPU per worker step grow with the workers (issue 38's acceptance)?

Async PS on Ray whose compute is mostly modelled time (``--stragglers slow:k=W,factor=50``:
each worker sleeps 49 x its measured gradient computation after each step; ``default`` model,
B = 512), with W = 1 and W = 16 worker actors, each at two run lengths (24 and 96 steps per
worker), interleaved per repeat. From the two lengths, marginal figures (what the start-up,
compile and the run's first steps cost is in both and cancels):

* ``S_W``: worker steps per second, (n_96 - n_24) / (t_96 - t_24) over the roles' run;
* ``c_W``: CPU seconds per worker step of the run's processes: the driver and every process
  under it (Ray's GCS, raylet, the PS shard and worker actors), from /proc (`psutil`), less
  the sampler's own thread; ``box_c_W`` is the same from the whole box's busy time
  (`psutil.cpu_times`: other users of the box included);
* ``driver_W``: the driver process's own CPU per worker step (all its threads but the
  sampler's);
* ``driver_peak_rss_W``: the driver's largest resident set seen while the run's roles ran
  (sampled every 0.1 s).

The acceptance it prints: (a) S_16 >= 0.8 x min(16 x S_1, cores / c_16): near-ideal, or every
core busy with per-step work; (b) c_16 <= 1.25 x c_1; and the driver <= 1 ms per worker step.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time

import psutil

from algorithms.tools import roles

LENGTHS = (24, 96)  # steps per worker
WORKERS = (1, 16)


class _Tree:
    """CPU seconds of this process (less the sampler's thread) and of every process under it."""

    def __init__(self):
        self.me = psutil.Process()
        self.procs: dict[int, psutil.Process] = {}

    def sample(self, sampler_cpu: float) -> tuple[float, dict[int, float], int]:
        """``(this process's CPU s less `sampler_cpu`, {pid: CPU s} of its descendants,
        this process's resident bytes)``."""
        t = self.me.cpu_times()
        cpu = {}
        for p in self.me.children(recursive=True):
            q = self.procs.setdefault(p.pid, p)
            with contextlib.suppress(psutil.Error):
                c = q.cpu_times()
                cpu[p.pid] = c.user + c.system
        return t.user + t.system - sampler_cpu, cpu, self.me.memory_info().rss


def _box_busy() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


@contextlib.contextmanager
def _sampling(period: float = 0.1):
    """``[(perf_counter, box busy s, driver CPU s, {pid: CPU s}, driver rss)]`` every `period`
    s while inside; the sampler's own CPU is taken out of the driver's (and so the tree's)."""
    tree, samples, stop = _Tree(), [], threading.Event()

    def run() -> None:
        own = 0.0
        while True:
            c0 = time.thread_time()
            box = _box_busy()
            driver, kids, rss = tree.sample(own)
            samples.append((time.perf_counter(), box, driver, kids, rss))
            own += time.thread_time() - c0
            if stop.wait(period):
                return

    th = threading.Thread(target=run, name="bench-serial-sampler", daemon=True)
    th.start()
    try:
        yield samples
    finally:
        stop.set()
        th.join()


def _between(samples: list, lo: float, hi: float) -> dict:
    """CPU seconds (box, driver, tree) and the driver's peak RSS between the first sample at
    or after `lo` and the last at or before `hi`; `seconds`: that span."""
    win = [s for s in samples if lo <= s[0] <= hi]
    if len(win) < 2:
        raise RuntimeError(f"only {len(win)} CPU samples in a {hi - lo:.2f} s window")
    (t0, b0, d0, k0, _), (t1, b1, d1, k1, _) = win[0], win[-1]
    kids = sum(c - k0.get(pid, 0.0) for pid, c in k1.items())
    return {"seconds": t1 - t0, "box": b1 - b0, "driver": d1 - d0, "tree": d1 - d0 + kids,
            "rss": max(s[4] for s in win)}


def _run(workers: int, per_worker: int, batch: int, factor: float, seed: int) -> dict:
    """One run; its roles' run's worker steps, seconds and CPU (`_between`)."""
    import algorithms
    from algorithms.tools.bench_ray import bench_config

    steps = workers * per_worker
    cfg = bench_config("ray", workers, steps, batch, f"slow:k={workers},factor={factor}",
                       model="default", seed=seed)
    with _sampling() as samples, roles.timed() as run:
        out = algorithms.run(cfg)
    d, end = out["segment_seconds"], run["end"]
    got = _between(samples, end - d, end)
    # the window's CPU scaled to the roles' whole run (samples are 0.1 s apart)
    scale = d / got["seconds"]
    row = {"workers": workers, "steps": steps, "seconds": d,
           **{k: got[k] * scale for k in ("box", "driver", "tree")}, "rss": got["rss"]}
    print(f"  W={workers} steps={steps}: {steps / d:.1f} steps/s, tree "
          f"{row['tree'] / steps * 1e3:.1f} ms/step, driver {row['driver'] / steps * 1e3:.2f} "
          f"ms/step, rss {row['rss'] / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    return row


def _marginal(short: dict, long: dict) -> dict:
    n = long["steps"] - short["steps"]
    return {"S": n / (long["seconds"] - short["seconds"]),
            "c": (long["tree"] - short["tree"]) / n,
            "box_c": (long["box"] - short["box"]) / n,
            "driver": (long["driver"] - short["driver"]) / n,
            "rss": max(short["rss"], long["rss"])}


def bench_serial(repeats: int, batch: int = 512, factor: float = 50.0,
                 workers: tuple = WORKERS, lengths: tuple = LENGTHS) -> dict:
    """Measurement 7 (see the module docstring), `repeats` interleaved repeats."""
    per: dict[int, list[dict]] = {w: [] for w in workers}
    for r in range(repeats):
        for w in workers:
            short, long = (_run(w, n, batch, factor, seed=r) for n in lengths)
            per[w].append(_marginal(short, long))
            print(f"  W={w}: {per[w][-1]}", file=sys.stderr, flush=True)

    def med(w: int, k: str) -> float:
        return statistics.median(x[k] for x in per[w])

    lo, hi = min(workers), max(workers)
    cores = psutil.cpu_count()
    s_lo, s_hi, c_lo, c_hi = med(lo, "S"), med(hi, "S"), med(lo, "c"), med(hi, "c")
    bound = min(hi / lo * s_lo, cores / c_hi)
    out = {"name": "ray/serial", "model": "dlrm (default config)", "batch_size": batch,
           "straggler_factor": factor, "steps_per_worker": list(lengths), "repeats": repeats,
           "cores": cores, "load_average": list(psutil.getloadavg()),
           **{f"S_{w}": med(w, "S") for w in workers},
           **{f"c_{w}_ms": med(w, "c") * 1e3 for w in workers},
           **{f"box_c_{w}_ms": med(w, "box_c") * 1e3 for w in workers},
           **{f"driver_{w}_ms": med(w, "driver") * 1e3 for w in workers},
           **{f"driver_peak_rss_{w}_mib": max(x["rss"] for x in per[w]) / 2**20
              for w in workers},
           "a_bound": bound, "a_ratio": s_hi / bound, "a_met": s_hi >= 0.8 * bound,
           "b_ratio": c_hi / c_lo, "b_met": c_hi <= 1.25 * c_lo,
           "driver_met": all(med(w, "driver") <= 1e-3 for w in workers), "all": per}
    drivers = ", ".join(f"{med(w, 'driver') * 1e3:.2f}" for w in workers)
    print(f"(a) S_{hi} = {s_hi:.1f} steps/s vs 0.8 x min({hi // lo} x S_{lo} = "
          f"{hi / lo * s_lo:.1f}, {cores} / c_{hi} = {cores / c_hi:.1f}) = {0.8 * bound:.1f}: "
          f"{'met' if out['a_met'] else 'NOT met'} ({out['a_ratio']:.2f} of the bound)\n"
          f"(b) c_{hi} = {c_hi * 1e3:.1f} ms vs 1.25 x c_{lo} = {1.25 * c_lo * 1e3:.1f} ms: "
          f"{'met' if out['b_met'] else 'NOT met'}\n"
          f"driver: {drivers} ms per worker step (<= 1): "
          f"{'met' if out['driver_met'] else 'NOT met'}",
          file=sys.stderr, flush=True)
    return out
