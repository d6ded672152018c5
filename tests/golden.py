"""Golden outputs of every algorithm, to show a restructuring keeps behaviour byte for byte.

    python -m tests.golden record tests/golden.json     # before the change
    python -m tests.golden check tests/golden.json      # after it: lists every difference

One short run per ``--algo`` (and per ``--gba.mode`` / ``--persia.mode``): ``--deterministic``
for the host-async algorithms (the virtual clock), SPMD on 2 fake CPU devices. For each run the
file keeps the sha256 of ``predictions.csv`` and the summary without what measures time or
names the machine or the output directory, and without its echo of the config. Floats are
compared exactly: the file is valid on the CPU and the jax version it names (XLA:CPU may round
differently elsewhere; `check` says so). Not a pytest module: a golden set is recorded and
checked around one restructuring; tests/golden.json is the set of the registry change (AMD
EPYC, jax 0.10.2), with three runs added on 2026-11-27 (``record --only NAMES --add``) where
the set had nothing: GBA's per-id rule firing, DiLoCo, DCN-v2. ``shadow-ckpt`` was
re-recorded once for a named fix that changed only its ``data_rows_read``: a host-async run's
checkpoint intervals share one runtime, so the rows read cover every interval of the process,
not the last one only (algorithms/runtime/intervals.py). Every run was re-recorded once to add
two summary fields of a synthetic teacher's eval, ``eval_kl_to_bayes`` and ``eval_excess_ne``
(recjax/train/contract.py): every other value and every predictions.csv hash was unchanged.
``shadow`` and ``shadow-ckpt`` were re-recorded for a named fix: S-EASGD's exchange follows
Alg. 2's two lines in order (``shadowsync.easgd_form=sequential``), where it used the values
from before the sync for both (``simultaneous``, which reproduces the old records).
Every run was re-recorded once more (2026-11-29) to add the summary's ``eval_logit_spread``
(recjax/train/contract.py): nothing else changed, no value and no predictions.csv hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--config", "smoke", "--steps", "24", "--batch-size", "64", "--synthetic.n_eval=2000",
          "--save-predictions", "--no-progress", "--train.log_every=8"]
ASYNC = ["--deterministic"]
RUNS: dict[str, list[str]] = {
    "single": ["--algo", "single"],
    "sync": ["--algo", "sync", "--devices", "2"],
    "des": ["--algo", "des", "--devices", "2", "--model", "deepfm"],
    "async": ["--algo", "async", *ASYNC],
    "shadow": ["--algo", "shadow", *ASYNC],
    "fr": ["--algo", "fr", "--shadowsync.sync", "ma", *ASYNC],
    **{f"gba-{m}": ["--algo", "gba", "--gba.mode", m, "--stragglers", "slow:k=1,factor=3", *ASYNC]
       for m in ("gba", "sync", "async", "hop_bs", "bsp", "hop_bw")},
    **{f"persia-{m}": ["--algo", "persia", "--persia.mode", m, *ASYNC]
       for m in ("hybrid", "sync", "async")},
    "async-lru": ["--algo", "async", "--embed.store", "lru", "--embed.capacity", "300", *ASYNC],
    "single-ckpt": ["--algo", "single", "--train.ckpt_every", "8"],
    # added 2026-11-27 (the per-id rule fires at iota 1; DiLoCo; DCN-v2's mixture)
    "gba-iota1": ["--algo", "gba", "--gba.iota", "1", "--stragglers", "slow:k=1,factor=3", *ASYNC],
    "diloco": ["--algo", "diloco", "--devices", "2", "--diloco.inner_steps", "4"],
    "single-dcn_v2": ["--algo", "single", "--model", "dcn_v2", "--model.cross_rank", "4",
                      "--model.cross_experts", "2"],
    "shadow-ckpt": ["--algo", "shadow", "--train.ckpt_every", "8", *ASYNC],
}
# summary keys that measure time, name the machine or the output directory, and the config
# echo (a new field would show as a difference of every run)
VOLATILE = re.compile(r"(seconds|per_sec|qps|wall|hardware|^out$|best_checkpoint|^config$)")


def _stable(x):
    if isinstance(x, dict):
        return {k: _stable(v) for k, v in x.items() if not VOLATILE.search(k)}
    if isinstance(x, list):
        return [_stable(v) for v in x]
    return x


def machine() -> dict:
    import jax

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu or platform.processor(), "jax": jax.__version__}


def run_one(name: str, args: list[str], tmp: str) -> dict:
    out = os.path.join(tmp, name)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "scripts/train.py", *COMMON, *args, "--out", out],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode:
        return {"error": r.stderr.strip().splitlines()[-1:]}
    with open(os.path.join(out, "predictions.csv"), "rb") as f:
        preds = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return {"predictions_sha256": preds, "summary": _stable(summary)}


def record(names: list[str]) -> dict:
    got = {"machine": machine(), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            print(f"[{i + 1}/{len(names)}] {name}", file=sys.stderr, flush=True)
            got["runs"][name] = run_one(name, RUNS[name], tmp)
    return got


def diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}{k}: {'only now' if k not in a else 'gone'}")
            else:
                out += diff(a[k], b[k], f"{path}{k}.")
        return out
    return [] if a == b else [f"{path.rstrip('.')}: golden {a!r}, now {b!r}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("record", "check"))
    ap.add_argument("file")
    ap.add_argument("--only", nargs="*", default=None, help="these runs only")
    ap.add_argument("--add", action="store_true",
                    help="record: add (or replace) the --only runs in FILE, keep the others")
    a = ap.parse_args(argv)
    names = a.only or list(RUNS)
    if a.action == "record":
        got = record(names)
        if a.add:
            with open(a.file) as f:
                old = json.load(f)
            if old["machine"] != got["machine"]:
                raise SystemExit(f"{a.file} was recorded on {old['machine']}; adding runs "
                                 f"recorded on {got['machine']} would mix machines")
            got = {**old, "runs": {**old["runs"], **got["runs"]}}
        with open(a.file, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        return 0
    with open(a.file) as f:
        want = json.load(f)
    now = record(names)
    if now["machine"] != want["machine"]:
        print(f"note: recorded on {want['machine']}, checked on {now['machine']}: float "
              "differences may be the machine's", file=sys.stderr)
    bad = 0
    for name in names:
        d = diff(want["runs"].get(name), now["runs"][name])
        bad += bool(d)
        print(f"{name}: {'identical' if not d else f'{len(d)} difference(s)'}")
        for line in d[:20]:
            print("   ", line)
    print(f"{len(names) - bad} identical, {bad} different")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
