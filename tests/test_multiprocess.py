"""2 processes on localhost (jax.distributed, gloo) == 1 process with 2 devices, bit for bit
(4 devices: to float rounding, see the 2-D test).

Subprocesses (so each starts JAX fresh, without the 8 fake devices of conftest.py) on a free
port via scripts/launch.py; both runs dump their final state in the single-device layout.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

COMMON = ["--config", "smoke", "--batch-size", "64", "--steps", "4", "--synthetic.n_eval=1000",
          "--spmd.save_state=true", "--no-progress", "--save-predictions", "--train.log_every=2"]


def _run(cmd, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


def _compare(tmp_path, args, bitwise=True):
    train = [sys.executable, "scripts/train.py"] + COMMON + args
    _run([sys.executable, "scripts/launch.py", "--num-processes", "2", "--timeout", "100", "--"]
         + train + ["--out", str(tmp_path / "two")])
    devices = [] if "--devices" in args else ["--devices", "2"]
    _run(train + devices + ["--out", str(tmp_path / "one")])
    one, two = np.load(tmp_path / "one" / "final_state.npz"), np.load(tmp_path / "two" / "final_state.npz")
    assert sorted(one.files) == sorted(two.files) and len(one.files) > 5
    for k in one.files:
        if bitwise:
            np.testing.assert_array_equal(two[k], one[k], err_msg=k)
        else:
            np.testing.assert_allclose(two[k], one[k], rtol=1e-5, atol=1e-8, err_msg=k)
    # process 0 writes what a single process writes; the checkpoint is both processes'
    assert (tmp_path / "two" / "summary.json").exists()
    assert (tmp_path / "two" / "checkpoints" / "4" / "state" / "ocdbt.process_1").is_dir()
    rows = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [2, 4]
    # the final eval, then (every --algo but single) the algorithm's counters record
    assert [r["kind"] for r in rows][-2:] == ["eval", "counters"]
    preds = [np.loadtxt(tmp_path / d / "predictions.csv", delimiter=",", skiprows=1) for d in ("one", "two")]
    assert preds[0].shape == (1000, 2)
    np.testing.assert_allclose(preds[1], preds[0], rtol=1e-5, atol=1e-7)
    # the summary's counters are the whole run's, not process 0's (each holds its block of
    # every batch: the route-capacity check joins the processes' flags)
    one, two = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    assert two.get("route_over_capacity") == one.get("route_over_capacity")
    return one


def test_resume_without_out_refused_before_starting(tmp_path):
    """A multi-process --resume needs the --out holding its checkpoints (tests/test_pod_runs.py
    resumes them): without one it is an error before anything starts."""
    cmd = [sys.executable, "scripts/train.py", "--config", "smoke", "--algo", "des", "--resume",
           "--spmd.num_processes=2", "--spmd.process_id=0", "--spmd.coordinator=127.0.0.1:1"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--resume needs --out" in r.stderr, r.stderr[-2000:]


def test_des_two_processes_equal_one(tmp_path):
    _compare(tmp_path, ["--algo", "des", "--model", "deepfm"])


@pytest.mark.slow
def test_sync_two_processes_equal_one(tmp_path):
    # The dense gradients are all-reduced over 4 devices: gloo across processes and XLA inside
    # one add the 4 terms in different orders, so the runs agree to float rounding (1e-9 here),
    # not bit for bit as the 2-device runs do (a sum of 2 terms does not depend on the order).
    _compare(tmp_path, ["--algo", "sync", "--mesh", "data=2,model=2", "--devices", "4",
                        "--spmd.table_rules=emb/C1:table_wise;emb/C2:column_wise"], bitwise=False)


@pytest.mark.slow
def test_sync_one_axis_routed_two_processes_equal_one(tmp_path):
    """The 1-D mesh's owner routing: all_to_all of ids, rows and row gradients across processes."""
    _compare(tmp_path, ["--algo", "sync", "--spmd.route_capacity=8"])


@pytest.mark.slow
def test_route_capacity_counts_every_processes_batches(tmp_path):
    """At a routing capacity that some batches exceed, the two processes' summary counts the
    steps over it as the single process does, though each process checked only its block."""
    one = _compare(tmp_path, ["--algo", "sync", "--spmd.route_capacity=0.55"])
    assert 0 < one["route_over_capacity"]["over"] < one["route_over_capacity"]["checked_batches"]


def _launch(args, out, timeout=100):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    cmd = [sys.executable, "scripts/launch.py", "--num-processes", "2", "--timeout", str(timeout),
           "--", sys.executable, "scripts/train.py", *COMMON, *args, "--out", str(out)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout + 20)


def _files(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}


@pytest.mark.slow
def test_the_out_policy_holds_for_a_multi_process_run(tmp_path):
    """Issue 40 item 3: a 2-process run into the --out of a single-process run (checkpoints
    there) is refused by every process, and the old run's files are left as they were; so is
    a second 2-process run into the --out of a finished one (its checkpoints)."""
    out = tmp_path / "single"
    _run([sys.executable, "scripts/train.py", *COMMON, "--out", str(out)])
    before = _files(out)
    r = _launch(["--algo", "des", "--model", "deepfm"], out)
    assert r.returncode != 0 and "already holds checkpoints" in r.stderr, r.stderr[-3000:]
    assert _files(out) == before
    # every process stopped with the reason, none waited for the others' first step
    assert r.stderr.count("process 0 refused --out") == 1, r.stderr[-3000:]

    multi = tmp_path / "multi"
    assert _launch(["--algo", "des", "--model", "deepfm"], multi).returncode == 0
    before = _files(multi)
    r = _launch(["--algo", "des", "--model", "deepfm"], multi)
    assert r.returncode != 0 and "already holds checkpoints" in r.stderr, r.stderr[-3000:]
    assert _files(multi) == before


@pytest.mark.slow
def test_a_multi_process_run_waits_for_no_lock_holder(tmp_path):
    """Another process holds --out's lock: the 2-process job is refused, naming it."""
    out = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, '.');"
                               "from recjax.train import contract; contract.lock_out(sys.argv[1]);"
                               "print('held', flush=True); time.sleep(60)", str(out)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = _launch(["--algo", "des", "--model", "deepfm"], out)
        assert r.returncode != 0 and "in use by another run" in r.stderr, r.stderr[-3000:]
        assert not (out / "summary.json").exists()
    finally:
        holder.kill()
        holder.wait()
