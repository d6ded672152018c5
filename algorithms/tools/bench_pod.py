"""The cost of multi-process checkpoints (issue 37): the async save's overhead per checkpoint
interval, and the restore time of a checkpoint written by 2 processes into 1, 2 and 4.

    python scripts/bench_pod.py [--config dlrm_kaggle] [--every 50] [--repeats 5]

**Save** (one `scripts/launch.py` job of 2 processes, sync on ``data=2``): ``repeats``
interleaved triples of K = ``--every`` training steps: A without a checkpoint, C with the
trainer's stop check after each step (`agree_any`, one collective), and B with a checkpoint:
B starts a save (`ShardedCheckpointer.save`: the state as stored, on the devices
(`CheckpointLayout.logical`), its wsum32s, orbax's copy off the devices; the write and commit
go on in orbax's threads), trains its K steps meanwhile, and then waits for the commit and
checks it (`finish`, which a run does when its next save starts). The overhead at that
interval is ``median(B) / median(A) - 1``, the stop check's ``median(C) / median(A) - 1``;
also reported: the blocking part of each save and of each finish, their parts
(``save_parts_s``: layout, checksums, orbax_save, commit_wait, commit_check), a step's median
time, and the CPU seconds of both processes (every thread) in A and in B: their difference is
what a save costs a host's cores, which a host with idle cores absorbs.

**Restore**: the last checkpoint of the save job read by 1 process (`Checkpointer`, one
device: what ``--algo gba`` and a 1-device resume do), by 2 and by 4 processes
(`ShardedCheckpointer` with the target's layout, then `SyncStrategy.place_restored` into the
strategy's own layout), each ``--restore-repeats`` times; process 0's median seconds.

Each process builds the full initial state on the host (as `scripts/train.py` does), so 4
processes of dlrm_kaggle need about 4 x 3 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV_KEY = "RECJAX_BENCH_POD"  # the worker's task, as JSON (set by `main` for launch.py's copies)


def _worker(argv: list[str]) -> None:
    """One process of a job: `task["mode"]` is save or restore; process 0 writes the result."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from algorithms.sync import SyncSetup, SyncStrategy
    from recjax import cli
    from recjax.checkpoint import Checkpointer
    from recjax.checkpoint_sharded import ShardedCheckpointer, agree_any
    from recjax.data.pipeline import batches
    from recjax.train.data import open_data
    from recjax.train.setup import build
    from sharding import mesh

    task = json.loads(os.environ[ENV_KEY])
    cfg, _ = cli.parse(argv, "bench_pod worker")
    n = mesh.init_runtime(cfg)
    setup = SyncSetup.from_config(cfg, n)
    data = open_data(cfg)
    model, tx, sopt, state = build(cfg, data.spec)
    strat = SyncStrategy(setup, model, tx, sopt)
    directory = task["dir"]
    lead = jax.process_index() == 0
    result: dict = {"processes": jax.process_count(), "devices": n}
    if task["mode"] == "restore":
        like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), state)
        del state
        times = []
        for _ in range(task["repeats"]):
            t = time.perf_counter()
            if jax.process_count() == 1:
                restored, _ = Checkpointer(directory).restore(like)
                jax.block_until_ready(restored)
            else:
                restored, _ = ShardedCheckpointer(directory, setup.mesh).restore(like)
                jax.block_until_ready(strat.place_restored(restored))
            times.append(time.perf_counter() - t)
            del restored
        result |= {"restore_s": times, "restore_s_median": statistics.median(times)}
    else:
        s = strat.prepare(state)
        del state
        host = [b for b, _ in zip((b for b, _ in batches(
            data.train, cfg.train.batch_size, seed=0, epoch=0, shuffle_buffer=0,
            drop_remainder=True)), range(4))]
        placed = [strat.put_batch(b) for b in host]
        k, step = task["every"], 0
        ckpt = ShardedCheckpointer(directory, setup.mesh, max_to_keep=2)

        def steps(count: int, agree: bool = False, marks: list | None = None) -> float:
            nonlocal s, step
            t = time.perf_counter()
            for i in range(count):
                s, m = strat.train_step(s, placed[step % len(placed)])
                step += 1
                if agree:  # what the trainer does between steps (`recjax.train.loop`)
                    agree_any(False)
                if marks is not None and (i + 1) % max(count // 10, 1) == 0:
                    jax.block_until_ready(m.loss)  # each tenth of the interval, done
                    marks.append(time.perf_counter() - t)
            jax.block_until_ready(m.loss)
            return time.perf_counter() - t

        def cpu() -> float:  # CPU seconds of both processes, every thread (orbax's included)
            return float(np.sum(multihost_utils.process_allgather(
                np.float64(time.process_time()))))

        def plain_interval() -> tuple[float, float, list]:
            c, marks = cpu(), []
            return steps(k, marks=marks), cpu() - c, marks

        def interval() -> tuple[float, float, float, float, dict]:
            c = cpu()
            t = time.perf_counter()
            stored = jax.block_until_ready(strat.logical(s))
            t_layout = time.perf_counter() - t
            ckpt.save(step, stored, {"config": {}})
            del stored
            blocking = time.perf_counter() - t
            parts = dict(ckpt.timings) | {"layout": t_layout}
            parts["tenths"] = []
            steps(k, marks=parts["tenths"])
            t_fin = time.perf_counter()
            ckpt.finish()
            parts |= {k_: v for k_, v in ckpt.timings.items() if k_.startswith("commit")}
            end = time.perf_counter()
            return end - t, blocking, end - t_fin, cpu() - c, parts

        steps(3)  # compile
        interval()  # compile the layout and checksum functions
        plain, with_ckpt, blocking, finish, agreed, parts = [], [], [], [], [], []
        cpu_plain, cpu_ckpt, tenths = [], [], []
        for _ in range(task["repeats"]):
            t, c, marks = plain_interval()
            plain.append(t)
            tenths.append(marks)
            cpu_plain.append(c)
            agreed.append(steps(k, agree=True))
            total, b, f, c, p = interval()
            with_ckpt.append(total)
            blocking.append(b)
            finish.append(f)
            cpu_ckpt.append(c)
            parts.append(p)
        ckpt.close()
        a, b = statistics.median(plain), statistics.median(with_ckpt)
        save_cpu = statistics.median(cpu_ckpt) - statistics.median(cpu_plain)
        result |= {"every": k, "interval_plain_s": plain, "interval_with_save_s": with_ckpt,
                   "save_blocking_s": blocking, "finish_s": finish,
                   "interval_with_stop_check_s": agreed, "save_parts_s": parts,
                   "cpu_plain_s": cpu_plain, "cpu_with_save_s": cpu_ckpt,
                   "step_s_median": a / k, "overhead": b / a - 1,
                   "stop_check_overhead": statistics.median(agreed) / a - 1,
                   "save_blocking_s_median": statistics.median(blocking),
                   "finish_s_median": statistics.median(finish),
                   "save_cpu_s_median": save_cpu,
                   "plain_tenths_s": tenths,
                   "save_parts_s_median": {key: statistics.median(p[key] for p in parts)
                                           for key in parts[0] if key != "tenths"}}
    if lead:
        pathlib.Path(task["result"]).write_text(json.dumps(result))


def _job(processes: int, task: dict, args: list[str], timeout: float) -> dict:
    from recjax.tools.launch import launch

    with tempfile.TemporaryDirectory() as tmp:
        task = task | {"result": os.path.join(tmp, "result.json")}
        env = os.environ | {ENV_KEY: json.dumps(task), "JAX_PLATFORMS": "cpu"}
        env.pop("XLA_FLAGS", None)
        cmd = [sys.executable, str(ROOT / "scripts" / "bench_pod.py"), "--worker", *args]
        if processes == 1:
            code = subprocess.run(cmd, env=env, timeout=timeout).returncode
        else:
            old = dict(os.environ)
            os.environ.update(env)
            try:
                code = launch(cmd, processes, timeout=timeout)
            finally:
                os.environ.clear()
                os.environ.update(old)
        if code:
            raise RuntimeError(f"bench_pod {task['mode']} with {processes} processes: exit {code}")
        return json.loads(pathlib.Path(task["result"]).read_text())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        _worker(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="dlrm_kaggle")
    ap.add_argument("--every", type=int, default=50, help="steps per checkpoint interval (K)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--restore-repeats", type=int, default=3)
    ap.add_argument("--restore-processes", default="1,2,4", help="'' for none")
    ap.add_argument("--timeout", type=float, default=3000.0)
    ap.add_argument("--dir", default="", help="write the checkpoints under this directory "
                    "(default: the system's temporary directory)")
    ap.add_argument("--json", default="", help="also write the report here")
    a, rest = ap.parse_known_args(argv)
    args = ["--config", a.config, "--no-progress", *rest]
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=a.dir or None) as d:
        report = {"config": a.config, "load_before": load, "dir": a.dir or tempfile.gettempdir(),
                  "save": _job(2, {"mode": "save", "dir": d, "every": a.every,
                                   "repeats": a.repeats}, args, a.timeout)}
        print(json.dumps(report["save"]), flush=True)
        report["restore"] = []
        for p in [int(x) for x in a.restore_processes.split(",") if x]:
            r = _job(p, {"mode": "restore", "dir": d, "repeats": a.restore_repeats}, args,
                     a.timeout)
            report["restore"].append(r)
            print(json.dumps(r), flush=True)
    report["load_after"] = os.getloadavg()
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
