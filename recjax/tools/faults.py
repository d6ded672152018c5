"""Kill, interrupt and resume training runs at random moments; check nothing is lost or changed.

    python scripts/faults.py                      # 3 cycles each of single, sync, shadow (minutes)
    python scripts/faults.py --cycles 20 --algos shadow --seed 3 --json faults.json
    python scripts/faults.py --out-cases          # the --out policy of 2-process runs
    python scripts/faults.py --ray-cases all      # kill -9 of PS0, raylet, GCS (twice), driver
    python scripts/faults.py --processes 2 --cycles 10   # 2-process sync (jax.distributed)

For each algorithm: one uninterrupted reference run, then the same run under faults. Each cycle
starts the run (``--resume`` once a checkpoint exists), waits until it trains (a checkpoint newer
than the one it started from) or until it writes a checkpoint (an orbax temp directory appears),
then sends SIGKILL, SIGINT, SIGTERM or two SIGINTs 50 ms apart, and waits for the process. After
the cycles the run is resumed to its end. Reported per algorithm (issue 16's acceptance):

* cycles run, and by fault and moment;
* lost: a fault after which the newest committed checkpoint on disk is older than the newest
  one seen committed before it (must be 0: a stop never costs more than the checkpoint interval);
* bitwise: the final checkpoint's arrays (their CRC-32s, recorded with them) and the summary's
  eval metrics equal the reference's (single, sync and the host-async algorithm on the virtual
  clock, ``--deterministic``); Train NE within 1e-6 (its float32 window sums are grouped by
  where the stops fell);
* bad exits: a SIGINT/SIGTERM stop that did not exit 130, or printed a traceback.

With ``--processes N`` the run is N processes under scripts/launch.py (``--algos sync`` or
``des``; `MULTI`), each fault goes to one process chosen at random (SIGKILL, SIGTERM, or two
SIGINTs), and each cycle also records how long the job took to end after it (``stopped_s``:
a SIGTERM stops every process at one step with a checkpoint; after a kill -9 the others are
stopped by jax.distributed's heartbeat, ``--spmd.heartbeat_timeout=10`` here, or launch.py's
``--grace``). The bitwise check compares the final checkpoints' wsum32 checksums (the same
for any layout, `recjax.checksum`) with an uninterrupted N-process run's.
"""

import argparse
import contextlib
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"  # runs as a user runs them
TRAIN = str(SCRIPTS / "train.py")
COMMON = ["--config", "smoke", "--train.progress=false", "--train.keep_ckpts=2"]
ALGOS = {  # the run under test: long enough for a fault to land in training or in a save
    "single": ["--steps", "300", "--train.ckpt_every=20"],
    "sync": ["--algo", "sync", "--devices", "2", "--steps", "300", "--train.ckpt_every=20"],
    "shadow": ["--algo", "shadow", "--sync", "easgd", "--trainers", "2",
               "--workers-per-trainer", "2", "--deterministic", "--steps", "100",
               "--train.ckpt_every=20"],
}
FAULTS = ["SIGKILL", "SIGINT", "SIGTERM", "double SIGINT"]
MULTI = {  # --processes N: SPMD runs under launch.py (one device per process)
    "sync": ["--algo", "sync", "--steps", "300", "--train.ckpt_every=20",
             "--spmd.heartbeat_timeout=10"],
    "des": ["--algo", "des", "--model", "deepfm", "--steps", "300", "--train.ckpt_every=20",
            "--spmd.heartbeat_timeout=10"],
}


def committed(out: pathlib.Path) -> list[int]:
    d = out / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def saving(out: pathlib.Path) -> bool:
    d = out / "checkpoints"
    return d.is_dir() and any("orbax-checkpoint-tmp" in p.name for p in d.iterdir())


def command(args: list[str], out: pathlib.Path, processes: int = 1) -> list[str]:
    """The training command; with `processes` > 1, under scripts/launch.py."""
    cmd = [sys.executable, TRAIN, *COMMON, *args, "--out", str(out)]
    if processes == 1:
        return cmd
    return [sys.executable, str(SCRIPTS / "launch.py"), "--num-processes", str(processes),
            "--grace", "30", "--", *cmd]


def launch(args: list[str], out: pathlib.Path, log: pathlib.Path,
           processes: int = 1) -> subprocess.Popen:
    resume = ["--resume"] if committed(out) else []
    f = open(log, "a")  # noqa: SIM115 (closed with the process by the caller)
    return subprocess.Popen(command([*args, *resume], out, processes), stdout=f,
                            stderr=subprocess.STDOUT, text=True)


def _process(launcher: subprocess.Popen, i: int) -> int | None:
    """The pid of launch.py's process `i` (``--spmd.process_id=i``), None if it is not there."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for c in psutil.Process(launcher.pid).children():
            if f"--spmd.process_id={i}" in c.cmdline():
                return c.pid
    return None


def fault_cycle(args, out, log, rng, fault: str, moment: str, timeout: float,
                processes: int = 1) -> dict:
    """One start and one fault (to one process, chosen at random); returns what happened."""
    start = committed(out)
    p = launch(args, out, log, processes)
    victim = rng.randrange(processes)
    seen, t0, sent = list(start), time.monotonic(), False
    since = None  # when training was first seen
    while p.poll() is None and time.monotonic() - t0 < timeout:
        now = committed(out)
        seen = sorted(set(seen) | set(now))
        trained = bool(now) and (not start or now[-1] > start[-1])
        if trained and since is None:
            since, delay = time.monotonic(), rng.uniform(0.0, 1.5)
        if since is not None and ((moment == "saving" and saving(out))
                                  or (moment == "training" and time.monotonic() - since > delay)):
            seen = sorted(set(seen) | set(committed(out)))
            sig = signal.SIGKILL if fault == "SIGKILL" else getattr(signal, fault.split()[-1])
            pid = p.pid if processes == 1 else _process(p, victim)
            if pid is None:  # (the job ended meanwhile)
                break
            os.kill(pid, sig)
            if fault == "double SIGINT":
                time.sleep(0.05)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
            sent = True
            break
        time.sleep(0.002 if since is not None else 0.05)
    t_sent = time.monotonic()
    try:
        code = p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    stopped_s = time.monotonic() - t_sent
    after = committed(out)
    text = log.read_text()
    last = text[text.rfind("=== cycle"):]
    return {"fault": fault if sent else None, "moment": moment, "exit": code,
            **({"process": victim, "stopped_s": round(stopped_s, 1)} if processes > 1 else {}),
            "newest_before": max(seen, default=None), "newest_after": max(after, default=None),
            "lost": bool(seen) and (not after or after[-1] < max(seen)),
            # a stop that lands in the last interval may end the run (exit 0, summary written)
            "bad_exit": sent and fault != "SIGKILL" and ("Traceback" in last or code not in (
                (130, 0) if (out / "summary.json").exists() else (130,))),
            "completed": code == 0 and (out / "summary.json").exists()}


def out_policy_cases(work: pathlib.Path, timeout: float) -> dict:
    """The ``--out`` policy under ``jax.distributed`` (issue 40 item 3): a 2-process DES run
    into the --out of a single-process run, and into that of a finished 2-process run. Each must
    be refused by every process with the old files left byte for byte, and no process left."""
    import psutil

    launch_py = str(SCRIPTS / "launch.py")
    multi = [sys.executable, launch_py, "--num-processes", "2", "--timeout", str(timeout), "--",
             sys.executable, TRAIN, *COMMON, "--algo", "des", "--model", "deepfm", "--steps", "8"]
    files = lambda d: {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()
                       and p.name != ".lock"}
    single, twice = work / "single", work / "multi"
    subprocess.run([sys.executable, TRAIN, *COMMON, "--steps", "8", "--out", str(single)],
                   check=True, capture_output=True, timeout=timeout)
    subprocess.run([*multi, "--out", str(twice)], check=True, capture_output=True, timeout=timeout)
    cases = []
    for name, out in (("into a single-process run's --out", single),
                      ("into a finished multi-process run's --out", twice)):
        before = files(out)
        r = subprocess.run([*multi, "--out", str(out)], capture_output=True, text=True,
                           timeout=timeout)
        cases.append({"case": name, "refused": r.returncode != 0 and "Traceback" not in r.stderr,
                      "files_changed": files(out) != before})
    me = {os.getpid(), *(q.pid for q in psutil.Process().parents())}  # their cmdline has it

    def left() -> list[int]:  # this check's processes only
        return [p.pid for p in psutil.process_iter(["cmdline", "status"])
                if p.pid not in me and p.info["status"] != psutil.STATUS_ZOMBIE
                and any(str(work) in c for c in (p.info["cmdline"] or []))]

    deadline = time.monotonic() + 15  # a refused process may still be exiting
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"cases": cases, "refused": sum(c["refused"] for c in cases),
            "files_changed": sum(c["files_changed"] for c in cases), "processes_left": len(left())}


RAY_VICTIMS = {  # name -> how to find the process among the run's (its /proc cmdline)
    "ps0": "ray::_Host", "raylet": "raylet/raylet", "gcs": "gcs/gcs_server", "driver": "train.py",
    "gcs_setup": "gcs/gcs_server"}  # GCS while the run sets up (no role runs yet)


def _procs(mark: str) -> dict[int, str]:
    """pid -> cmdline of the processes whose environment carries ``FAULTS_MARK=mark``."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"FAULTS_MARK={mark}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is no process
                    del out[int(pid)]
        except OSError:
            continue
    return out


def ray_cases(work: pathlib.Path, timeout: float, victims=tuple(RAY_VICTIMS)) -> dict:
    """Ray's own processes dying (issue 40 item 6): a GBA run on Ray with a checkpoint every
    200 steps; once its second interval trains, kill -9 of GBA's PS0 actor, the raylet, GCS or
    the driver, or of GCS while the run sets up (``gcs_setup``: its PS shards started, its
    workers not yet; the intervals of a run share one runtime, so setting up is the run's
    start). Each must stop without a traceback (the driver: at once), keep every committed
    checkpoint (GCS in training: add one), resume on threads from the newest (where there is
    one), and leave no process."""
    cases = []
    for name in victims:
        out, log, mark = work / f"ray_{name}", work / f"ray_{name}.log", f"{name}-{time.time()}"
        env = dict(os.environ, FAULTS_MARK=mark, PYTHONUNBUFFERED="1")
        with open(log, "w") as f:
            p = subprocess.Popen([sys.executable, TRAIN, *COMMON, "--algo", "gba", "--backend",
                                  "ray", "--steps", "3000", "--train.ckpt_every=200", "--out",
                                  str(out)], stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            cases.append(_ray_case(name, p, mark, out, log, timeout))
        finally:  # this script failing must not leave a 3000-step run behind
            if p.poll() is None:
                p.kill()
        print(json.dumps(cases[-1]), flush=True)
    ok = all(c["killed"] and not c["traceback"] and not c["lost"]
             and (c["resumed"] or not c["committed_after"])
             and not c["processes_left"] and (c["exit"] == -9 if c["victim"] == "driver"
                                              else c["exit"] not in (0, -9) and c["error"])
             for c in cases)
    return {"cases": cases, "ok": ok, "lost": sum(c["lost"] for c in cases),
            "processes_left": sum(c["processes_left"] for c in cases)}


def _recorded(metrics: pathlib.Path) -> int:
    """The newest step of a ``train`` record in `metrics` (-1: none yet). The records written
    at a checkpoint interval's end carry its last step, so a record past the newest committed
    checkpoint is the first sign the next interval trains (its roles start afresh, which under
    load takes seconds: a fixed wait after any record killed some runs before their first
    step, leaving the stop nothing to add)."""
    steps = [-1]
    with contextlib.suppress(OSError):
        for line in metrics.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if rec.get("kind") == "train":
                    steps.append(int(rec["step"]))
    return max(steps)


def _ray_case(name, p, mark, out, log, timeout) -> dict:
    """Kill `name` once the run `p` trains its second interval (``gcs_setup``: while it sets
    up); what followed."""
    t0, victim, before = time.monotonic(), None, []
    metrics = out / "metrics.jsonl"
    while p.poll() is None and time.monotonic() - t0 < timeout and victim is None:
        procs = _procs(mark) if name == "gcs_setup" or committed(out) else {}
        hits = [q for q, cmd in procs.items() if RAY_VICTIMS[name] in cmd]
        cmds = " ".join(procs.values())
        if name == "gcs_setup":  # its shards started, its workers not yet: setup
            if (hits and "ShardServer" in cmds and "ComputeServer" not in cmds
                    and "RoleServer" not in cmds):
                before, victim = committed(out), hits[0]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
        elif hits and ("ComputeServer" in cmds or "RoleServer" in cmds):  # workers up
            last = committed(out)[-1]
            while (_recorded(metrics) <= last
                   and p.poll() is None and time.monotonic() - t0 < timeout):
                time.sleep(0.1)  # until the interval trains: a record past its start
            if hits[0] in _procs(mark):  # not the end of an interval
                before = committed(out)
                victim = p.pid if name == "driver" else hits[0]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
        time.sleep(0.2)
    t_kill = time.monotonic()
    try:
        code = p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    stopped_s = time.monotonic() - t_kill
    deadline = time.monotonic() + 10
    while _procs(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    left, after, text = _procs(mark), committed(out), log.read_text()
    resumed, resume_error = None, ""
    if after:
        r = subprocess.run([sys.executable, TRAIN, *COMMON, "--algo", "gba", "--steps",
                            str(after[-1] + 10), "--out", str(out), "--resume"],
                           capture_output=True, text=True, timeout=timeout)
        resumed = r.returncode == 0
        resume_error = "" if resumed else (r.stdout + r.stderr)[-2000:]  # why, when it failed
    error = [ln for ln in text.splitlines() if ln.startswith("error:")]
    return {"victim": name, "killed": victim is not None, "exit": code,
            "stopped_s": round(stopped_s, 1), "traceback": "Traceback" in text,
            "error": error[-1] if error else "", "committed_before": before,
            "committed_after": after, "lost": bool(before) and (
                not after or after[-1] < before[-1]),
            "resumed": resumed, "resume_error": resume_error, "processes_left": len(left),
            "log": str(log)}


def final_arrays(out: pathlib.Path) -> list:
    meta = json.loads((out / "checkpoints" / str(committed(out)[-1]) / "meta" / "metadata")
                      .read_text())
    return meta["integrity"]["arrays"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3, help="faults per algorithm")
    ap.add_argument("--algos", default=",".join(ALGOS), help=f"of {', '.join(ALGOS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="", help="keep the runs here (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per start")
    ap.add_argument("--json", default="", help="also write the report here")
    ap.add_argument("--out-cases", action="store_true",
                    help="instead: the --out policy of 2-process runs (issue 40 item 3)")
    ap.add_argument("--processes", type=int, default=1,
                    help="N > 1: SPMD runs of N processes under launch.py (--algos of "
                         f"{', '.join(MULTI)}; default sync), a fault to one of them")
    ap.add_argument("--ray-cases", default="", metavar="VICTIMS",
                    help="instead: kill -9 of Ray's own processes during a GBA run on Ray, "
                         f"of {','.join(RAY_VICTIMS)} (or 'all'; issue 40 item 6)")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    work = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="recjax-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    if a.ray_cases:
        names = RAY_VICTIMS if a.ray_cases == "all" else a.ray_cases.split(",")
        rep = ray_cases(work, a.timeout, tuple(names))
        print(json.dumps({k: v for k, v in rep.items() if k != "cases"}), flush=True)
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps(rep, indent=2) + "\n")
        return 0 if rep["ok"] else 1
    if a.out_cases:
        rep = out_policy_cases(work, a.timeout)
        print(json.dumps(rep, indent=1), flush=True)
        ok = rep["refused"] == len(rep["cases"]) and not rep["files_changed"]
        return 0 if ok and not rep["processes_left"] else 1
    report, ok = {}, True
    n = a.processes
    table = ALGOS if n == 1 else MULTI
    algos = a.algos if n == 1 or a.algos != ",".join(ALGOS) else "sync"
    for algo in algos.split(","):
        if algo not in table:
            raise SystemExit(f"--algos {algo}: with --processes {n} one of {', '.join(table)}")
        args, base = table[algo], work / (algo if n == 1 else f"{algo}-{n}p")
        base.mkdir(parents=True, exist_ok=True)
        ref, out, log = base / "ref", base / "run", base / "run.log"
        r = subprocess.run(command(args, ref, n), capture_output=True, text=True,
                           timeout=a.timeout)
        if r.returncode:
            raise SystemExit(f"{algo}: the reference run failed:\n{r.stdout}\n{r.stderr}")
        cycles = []
        for i in range(a.cycles):
            with open(log, "a") as f:
                f.write(f"\n=== cycle {i}\n")
            c = fault_cycle(args, out, log, rng, rng.choice(FAULTS),
                            rng.choice(["training", "saving"]), a.timeout, n)
            cycles.append(c)
            print(f"{algo} cycle {i}: {c}", flush=True)
            if c["completed"]:
                break
        if not (out / "summary.json").exists():  # resume to the end
            with open(log, "a") as f:
                f.write("\n=== cycle final\n")
            code = launch(args, out, log, n).wait(a.timeout)
            if code:
                raise SystemExit(f"{algo}: the final resume failed (exit {code}); see {log}")
        s_ref, s = (json.loads((d / "summary.json").read_text()) for d in (ref, out))
        keys = ["steps", "eval_auc", "eval_logloss", "eval_ne"]
        bitwise = (final_arrays(ref) == final_arrays(out)
                   and all(s_ref[k] == s[k] for k in keys))
        # Train NE sums float32 windows whose bounds move with the stops: equal to ~1e-7 only
        ne_rel = abs(s["train_ne"] - s_ref["train_ne"]) / abs(s_ref["train_ne"])
        faulted = [c for c in cycles if c["fault"]]
        report[algo] = {
            "cycles": len(faulted), "by_fault": {f: sum(c["fault"] == f for c in faulted)
                                                 for f in FAULTS},
            "during_saves": sum(c["moment"] == "saving" for c in faulted),
            "lost": sum(c["lost"] for c in cycles), "bad_exits": sum(c["bad_exit"] for c in cycles),
            "bitwise_equal": bitwise, "train_ne_rel_diff": ne_rel, "log": str(log),
            **({"processes": n, "stopped_s_max": {
                f: max((c["stopped_s"] for c in faulted if c["fault"] == f), default=None)
                for f in FAULTS}} if n > 1 else {})}
        ok &= (bitwise and ne_rel < 1e-6 and not report[algo]["lost"]
               and not report[algo]["bad_exits"])
        print(f"{algo}: {json.dumps(report[algo])}", flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    print("all resumes bitwise equal, no checkpoint lost" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
