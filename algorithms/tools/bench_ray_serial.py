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
  sampler's); ``gc_W``: of it, the seconds per worker step the driver spent in Python's
  garbage collection (`gc.callbacks`; a collection holds the GIL, so it is the driver's work);
  ``threads_W``: of it, each thread's CPU per worker step (`_thread_groups`: a Python thread
  by its `threading` name, one of Ray's by its OS name; digits folded, so a run's role threads
  are one group);
* ``driver_peak_rss_W``: the largest resident set of the benchmark's process (the driver)
  seen while the run's roles ran (sampled every 0.1 s; one process runs every run, so later
  runs include what earlier ones left);
* ``m_W``: the mean measured gradient computation of a step in its worker actor
  (`clock.Work.measured`, what the straggler's sleep multiplies: a step's modelled time is
  (F - 1) x m_W), over the long run.

The acceptance it prints: (a) S_16 >= 0.8 x min(16 x S_1, cores / c_16): near-ideal, or every
core busy with per-step work; (b) c_16 <= 1.25 x c_1; and the driver <= 1 ms per worker step.
Since the modelled time is a multiple of the measured compute, it grows when the actors share
too few cores (16 on 2): (a') compares S_16 with what 16 workers reach whose steps cost what
one worker's does except for that growth, ``S_free = 16 / (1 / S_1 + (F - 1) (m_16 - m_1))``,
and with cores / c_16.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import pathlib
import re
import statistics
import sys
import threading
import time

import psutil

from algorithms.tools import roles

LENGTHS = (24, 96)  # steps per worker
WORKERS = (1, 16)


SAMPLER = "bench-serial-sampler"


def _os_name(tid: int) -> str:
    try:
        return pathlib.Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def _thread_groups(me: psutil.Process) -> dict[tuple[int, str], float]:
    """``{(thread id, group): CPU s}`` of this process's live threads but the sampler: a Python
    thread's group is its `threading` name, any other thread's (Ray's, XLA's) its OS name, with
    each run of digits as ``#`` (``Thread-12 (_drive)`` and ``Thread-40 (_drive)`` are one
    group)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for t in me.threads():
        name = names.get(t.id) or _os_name(t.id)
        if name != SAMPLER:
            out[t.id, re.sub(r"\d+", "#", name)] = t.user_time + t.system_time
    return out


class _Tree:
    """CPU seconds of this process (less the sampler's thread), of each of its thread groups
    and of every process under it."""

    def __init__(self):
        self.me = psutil.Process()
        self.procs: dict[int, psutil.Process] = {}

    def sample(self, sampler_cpu: float) -> tuple[float, dict[int, float], int, dict]:
        """``(this process's CPU s less `sampler_cpu`, {pid: CPU s} of its descendants,
        this process's resident bytes, `_thread_groups`)``."""
        t = self.me.cpu_times()
        cpu = {}
        for p in self.me.children(recursive=True):
            q = self.procs.setdefault(p.pid, p)
            with contextlib.suppress(psutil.Error):
                c = q.cpu_times()
                cpu[p.pid] = c.user + c.system
        return (t.user + t.system - sampler_cpu, cpu, self.me.memory_info().rss,
                _thread_groups(self.me))


def _box_busy() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


@contextlib.contextmanager
def _sampling(period: float = 0.1):
    """``[(perf_counter, box busy s, driver CPU s, {pid: CPU s}, driver rss, {(thread id,
    group): CPU s})]`` every `period` s while inside; the sampler's own CPU is taken out of the
    driver's (and so the tree's)."""
    tree, samples, stop = _Tree(), [], threading.Event()

    def run() -> None:
        own = 0.0
        while True:
            c0 = time.thread_time()
            box = _box_busy()
            driver, kids, rss, threads = tree.sample(own)
            samples.append((time.perf_counter(), box, driver, kids, rss, threads))
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
    """CPU seconds (box, driver, tree, the driver's thread groups) and the driver's peak RSS
    between the first sample at or after `lo` and the last at or before `hi`; `seconds`: that
    span. A thread counts from its CPU at the first sample (0 if it started later) to its
    CPU at the last sample it was seen in (it may end inside)."""
    win = [s for s in samples if lo <= s[0] <= hi]
    if len(win) < 2:
        raise RuntimeError(f"only {len(win)} CPU samples in a {hi - lo:.2f} s window")
    (t0, b0, d0, k0, _, g0), (t1, b1, d1, k1, _, _) = win[0], win[-1]
    kids = sum(c - k0.get(pid, 0.0) for pid, c in k1.items())
    seen = {}
    for s in win:
        seen.update(s[5])
    threads: dict[str, float] = {}
    for (tid, g), c in seen.items():
        threads[g] = threads.get(g, 0.0) + c - g0.get((tid, g), 0.0)
    return {"seconds": t1 - t0, "box": b1 - b0, "driver": d1 - d0, "tree": d1 - d0 + kids,
            "rss": max(s[4] for s in win), "threads": threads}


@contextlib.contextmanager
def _measured():
    """``[measured seconds]`` of every worker step recorded inside (`worker.record_step`'s
    `measured`: a Ray worker's gradient computation, timed in its actor)."""
    from algorithms.runtime import ray_role_driver, worker

    record, take, out = worker.record_step, ray_role_driver.ActorWorker._take, []

    def noted(rt, wid, counters, item, m, it, measured=None, factor=None):
        if measured is not None:
            out.append(measured)
        return record(rt, wid, counters, item, m, it, measured, factor)

    def chunk(self, got):  # a role run in its actor: its chunk's steps, timed there
        out.extend(got["measured"])
        return take(self, got)

    worker.record_step = noted  # read by each `RayWorker` as it is built
    ray_role_driver.ActorWorker._take = chunk
    try:
        yield out
    finally:
        worker.record_step = record
        ray_role_driver.ActorWorker._take = take


@contextlib.contextmanager
def _gc_pauses():
    """``[(perf_counter at its start, seconds)]`` of every garbage collection of this process
    (any thread, any generation) while inside."""
    pauses, began = [], {}

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            began["t"] = time.perf_counter()
        elif "t" in began:
            t = began.pop("t")
            pauses.append((t, time.perf_counter() - t))

    gc.callbacks.append(note)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(note)


def _run(config, workers: int, per_worker: int, batch: int, factor: float, seed: int) -> dict:
    """One run of ``config(...)`` (`bench_ray.bench_config`); its roles' run's worker steps,
    seconds and CPU (`_between`)."""
    import algorithms

    steps = workers * per_worker
    cfg = config("ray", workers, steps, batch, f"slow:k={workers},factor={factor}",
                       model="default", seed=seed)
    with _sampling() as samples, roles.timed() as run, _measured() as secs, _gc_pauses() as gcs:
        out = algorithms.run(cfg)
    d, end = out["segment_seconds"], run["end"]
    got = _between(samples, end - d, end)
    collected = sum(s for t, s in gcs if end - d <= t <= end)  # in the roles' run
    # the window's CPU scaled to the roles' whole run (samples are 0.1 s apart)
    scale = d / got["seconds"]
    row = {"workers": workers, "steps": steps, "seconds": d,
           **{k: got[k] * scale for k in ("box", "driver", "tree")}, "rss": got["rss"],
           "gc": collected, "threads": {g: c * scale for g, c in got["threads"].items()},
           "m": statistics.fmean(secs) if secs else float("nan")}
    print(f"  W={workers} steps={steps}: {steps / d:.1f} steps/s, tree "
          f"{row['tree'] / steps * 1e3:.1f} ms/step, driver {row['driver'] / steps * 1e3:.2f} "
          f"ms/step (gc {collected / steps * 1e3:.2f}), rss {row['rss'] / 2**20:.0f} MiB, "
          f"m {row['m'] * 1e3:.2f} ms",
          file=sys.stderr, flush=True)
    return row


def _marginal(short: dict, long: dict) -> dict:
    n = long["steps"] - short["steps"]
    return {"S": n / (long["seconds"] - short["seconds"]),
            "c": (long["tree"] - short["tree"]) / n,
            "box_c": (long["box"] - short["box"]) / n,
            "driver": (long["driver"] - short["driver"]) / n,
            "gc": (long["gc"] - short["gc"]) / n,
            "threads": {g: (long["threads"].get(g, 0.0) - short["threads"].get(g, 0.0)) / n
                        for g in long["threads"].keys() | short["threads"].keys()},
            "rss": max(short["rss"], long["rss"]), "m": long["m"]}


def _median_groups(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per thread group, the median over `rows` (a group missing from a row counts 0), largest
    first."""
    groups = set().union(*rows)
    med = {g: statistics.median(r.get(g, 0.0) for r in rows) for g in groups}
    return dict(sorted(med.items(), key=lambda kv: -kv[1]))


def criteria(per: dict[int, list[dict]], factor: float, cores: int) -> dict:
    """Issue 38's acceptance from the repeats' marginal figures (`_marginal`, per worker count;
    medians): (a), (a'), (b) and the driver's (see the module docstring)."""
    lo, hi = min(per), max(per)

    def med(w: int, k: str) -> float:
        return statistics.median(x[k] for x in per[w])

    s_lo, s_hi, c_lo, c_hi = med(lo, "S"), med(hi, "S"), med(lo, "c"), med(hi, "c")
    m_lo, m_hi = med(lo, "m"), med(hi, "m")
    bound = min(hi / lo * s_lo, cores / c_hi)
    free = hi / (lo / s_lo + (factor - 1) * (m_hi - m_lo))
    bound_free = min(free, cores / c_hi)
    return {**{f"{k}_{w}": med(w, k) for w in per for k in ("S", "c", "box_c", "driver", "gc", "m")},
            **{f"driver_peak_rss_{w}_mib": max(x["rss"] for x in per[w]) / 2**20 for w in per},
            "a_bound": bound, "a_ratio": s_hi / bound, "a_met": s_hi >= 0.8 * bound,
            "S_free": free, "a_free_bound": bound_free, "a_free_ratio": s_hi / bound_free,
            "a_free_met": s_hi >= 0.8 * bound_free,
            "b_ratio": c_hi / c_lo, "b_met": c_hi <= 1.25 * c_lo,
            **{f"threads_{w}": _median_groups([x["threads"] for x in per[w]]) for w in per},
            "driver_met": all(med(w, "driver") <= 1e-3 for w in per)}


def bench_serial(config, repeats: int, batch: int = 512, factor: float = 50.0,
                 workers: tuple = WORKERS, lengths: tuple = LENGTHS,
                 roles: tuple = ("auto",)) -> list[dict]:
    """Measurement 7 (see the module docstring), `repeats` interleaved repeats of runs
    configured by `config` (`bench_ray.bench_config`, passed in: that module calls this one),
    for each ``--ray.roles`` in `roles` (interleaved too); one row per roles value, seconds in
    the row (``c_16`` is s per step)."""
    per = {ro: {w: [] for w in workers} for ro in roles}
    for r in range(repeats):
        for ro in roles:
            for w in workers:
                short, long = (_run(functools.partial(config, roles=ro), w, n, batch, factor,
                                    seed=r) for n in lengths)
                per[ro][w].append(_marginal(short, long))
                print(f"  roles={ro} W={w}: {per[ro][w][-1]}", file=sys.stderr, flush=True)
    return [_row(per[ro], ro, repeats, batch, factor, workers, lengths) for ro in roles]


def _row(per: dict, roles: str, repeats: int, batch: int, factor: float, workers: tuple,
         lengths: tuple) -> dict:
    cores = psutil.cpu_count()
    got = criteria(per, factor, cores)
    out = {"name": "ray/serial", "roles": roles, "model": "dlrm (default config)",
           "batch_size": batch,
           "straggler_factor": factor, "steps_per_worker": list(lengths), "repeats": repeats,
           "cores": cores, "load_average": list(psutil.getloadavg()), **got, "all": per}
    lo, hi = min(workers), max(workers)
    ms = {k: got[k] * 1e3 for k in got if k.startswith(("c_", "m_", "driver_")) and
          not k.endswith("mib")}
    drivers = ", ".join(f"{ms[f'driver_{w}']:.2f}" for w in workers)
    gcs = ", ".join(f"{got[f'gc_{w}'] * 1e3:.2f}" for w in workers)
    print(f"--ray.roles {roles}:\n"
          f"(a) S_{hi} = {got[f'S_{hi}']:.1f} steps/s vs 0.8 x min({hi // lo} x S_{lo} = "
          f"{hi / lo * got[f'S_{lo}']:.1f}, {cores} / c_{hi} = {cores / got[f'c_{hi}']:.1f}): "
          f"{'met' if got['a_met'] else 'NOT met'} ({got['a_ratio']:.2f} of the bound)\n"
          f"(a') S_{hi} vs 0.8 x min(S_free = {got['S_free']:.1f} (m_{lo} = {ms[f'm_{lo}']:.2f} "
          f"ms, m_{hi} = {ms[f'm_{hi}']:.2f} ms), {cores / got[f'c_{hi}']:.1f}): "
          f"{'met' if got['a_free_met'] else 'NOT met'} ({got['a_free_ratio']:.2f})\n"
          f"(b) c_{hi} = {ms[f'c_{hi}']:.1f} ms vs 1.25 x c_{lo} = {1.25 * ms[f'c_{lo}']:.1f} ms: "
          f"{'met' if got['b_met'] else 'NOT met'}\n"
          f"driver: {drivers} ms per worker step (<= 1): "
          f"{'met' if got['driver_met'] else 'NOT met'}; of it garbage collection {gcs} ms",
          file=sys.stderr, flush=True)
    for w in workers:
        top = ", ".join(f"{g} {c * 1e3:.2f}" for g, c in list(got[f"threads_{w}"].items())[:6])
        print(f"driver threads at W={w}, ms per worker step: {top}", file=sys.stderr, flush=True)
    return out
