"""Kill, interrupt and resume training runs at random moments; check nothing is lost or changed.

    python scripts/faults.py                      # 3 cycles each of single, sync, shadow (minutes)
    python scripts/faults.py --cycles 20 --algos shadow --seed 3 --json faults.json
    python scripts/faults.py --out-cases          # the --out policy of 2-process runs

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
"""

import argparse
import json
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

TRAIN = str(pathlib.Path(__file__).resolve().parent / "train.py")
COMMON = ["--config", "smoke", "--train.progress=false", "--train.keep_ckpts=2"]
ALGOS = {  # the run under test: long enough for a fault to land in training or in a save
    "single": ["--steps", "300", "--train.ckpt_every=20"],
    "sync": ["--algo", "sync", "--devices", "2", "--steps", "300", "--train.ckpt_every=20"],
    "shadow": ["--algo", "shadow", "--sync", "easgd", "--trainers", "2",
               "--workers-per-trainer", "2", "--deterministic", "--steps", "100",
               "--train.ckpt_every=20"],
}
FAULTS = ["SIGKILL", "SIGINT", "SIGTERM", "double SIGINT"]


def committed(out: pathlib.Path) -> list[int]:
    d = out / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def saving(out: pathlib.Path) -> bool:
    d = out / "checkpoints"
    return d.is_dir() and any("orbax-checkpoint-tmp" in p.name for p in d.iterdir())


def launch(args: list[str], out: pathlib.Path, log: pathlib.Path) -> subprocess.Popen:
    resume = ["--resume"] if committed(out) else []
    f = open(log, "a")  # noqa: SIM115 (closed with the process by the caller)
    return subprocess.Popen([sys.executable, TRAIN, *COMMON, *args, "--out", str(out), *resume],
                            stdout=f, stderr=subprocess.STDOUT, text=True)


def fault_cycle(args, out, log, rng, fault: str, moment: str, timeout: float) -> dict:
    """One start and one fault; returns what happened."""
    start = committed(out)
    p = launch(args, out, log)
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
            p.send_signal(sig)
            if fault == "double SIGINT":
                time.sleep(0.05)
                p.send_signal(signal.SIGINT)
            sent = True
            break
        time.sleep(0.002 if since is not None else 0.05)
    try:
        code = p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    after = committed(out)
    text = log.read_text()
    last = text[text.rfind("=== cycle"):]
    return {"fault": fault if sent else None, "moment": moment, "exit": code,
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

    launch_py = str(pathlib.Path(TRAIN).with_name("launch.py"))
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
    left = [p.pid for p in psutil.process_iter(["cmdline"])  # this check's processes only
            if any(str(work) in c for c in (p.info["cmdline"] or []))]
    return {"cases": cases, "refused": sum(c["refused"] for c in cases),
            "files_changed": sum(c["files_changed"] for c in cases), "processes_left": len(left)}


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
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    work = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="recjax-faults-"))
    if a.out_cases:
        rep = out_policy_cases(work, a.timeout)
        print(json.dumps(rep, indent=1), flush=True)
        ok = rep["refused"] == len(rep["cases"]) and not rep["files_changed"]
        return 0 if ok and not rep["processes_left"] else 1
    report, ok = {}, True
    for algo in a.algos.split(","):
        args, base = ALGOS[algo], work / algo
        base.mkdir(parents=True, exist_ok=True)
        ref, out, log = base / "ref", base / "run", base / "run.log"
        r = subprocess.run([sys.executable, TRAIN, *COMMON, *args, "--out", str(ref)],
                           capture_output=True, text=True, timeout=a.timeout)
        if r.returncode:
            raise SystemExit(f"{algo}: the reference run failed:\n{r.stdout}\n{r.stderr}")
        cycles = []
        for i in range(a.cycles):
            with open(log, "a") as f:
                f.write(f"\n=== cycle {i}\n")
            c = fault_cycle(args, out, log, rng, rng.choice(FAULTS),
                            rng.choice(["training", "saving"]), a.timeout)
            cycles.append(c)
            print(f"{algo} cycle {i}: {c}", flush=True)
            if c["completed"]:
                break
        if not (out / "summary.json").exists():  # resume to the end
            with open(log, "a") as f:
                f.write("\n=== cycle final\n")
            code = launch(args, out, log).wait(a.timeout)
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
            "bitwise_equal": bitwise, "train_ne_rel_diff": ne_rel, "log": str(log)}
        ok &= (bitwise and ne_rel < 1e-6 and not report[algo]["lost"]
               and not report[algo]["bad_exits"])
        print(f"{algo}: {json.dumps(report[algo])}", flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    print("all resumes bitwise equal, no checkpoint lost" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
