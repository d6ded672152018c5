"""Multi-process runs that survive (issue 37): checkpoints written by every process, resumed
on the same layout (bit for bit), on another process count and mesh and in one process (to
float rounding), handed to ``--algo gba`` and back; SIGTERM to one process and kill -9 of one.

Each run is `scripts/launch.py` with N processes on localhost (jax.distributed, gloo), one CPU
device each unless ``--devices`` says more; the runs dump their final state in the single-device
layout (``--spmd.save_state``). Only the first test runs in ``make test``: the others are
slow (several launches each on a 2-core box).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import ROOT

COMMON = ["--config", "smoke", "--batch-size", "64", "--synthetic.n_eval=1000",
          "--spmd.save_state=true", "--no-progress", "--train.log_every=2"]
ENV = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}


def _train(args, out):
    return [sys.executable, "scripts/train.py", *COMMON, *args, "--out", str(out)]


def _launch(n, args, out, timeout=240, grace=30):
    return [sys.executable, "scripts/launch.py", "--num-processes", str(n), "--timeout",
            str(timeout), "--grace", str(grace), "--", *_train(args, out)]


def _run(cmd, code=0, timeout=300):
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == code, r.stdout[-2000:] + r.stderr[-4000:]
    return r


def _state(d):
    f = np.load(d / "final_state.npz")
    return {k: f[k] for k in f.files}


def _steps(d):
    return sorted(int(p.name) for p in (d / "checkpoints").iterdir() if p.name.isdigit())


def _copy_checkpoint(src, dst, step):
    """A run directory holding only `src`'s checkpoint `step` (and its records)."""
    (dst / "checkpoints").mkdir(parents=True)
    shutil.copytree(src / "checkpoints" / str(step), dst / "checkpoints" / str(step))
    shutil.copy(src / "metrics.jsonl", dst / "metrics.jsonl")


def _assert_same(a, b, rtol=None, atol=None):
    assert sorted(a) == sorted(b) and len(a) > 5
    for k in a:
        if rtol is None:
            np.testing.assert_array_equal(b[k], a[k], err_msg=k)
        else:
            np.testing.assert_allclose(b[k], a[k], rtol=rtol, atol=atol, err_msg=k)


SYNC = ["--algo", "sync", "--steps", "6"]


def test_two_processes_save_their_shards_and_resume_bitwise(tmp_path):
    """Stopped after 3 of 6 steps and resumed, both at 2 processes: the final state equals the
    uninterrupted run's bit for bit (1 process with 2 devices, which 2 processes equal bit for
    bit, tests/test_multiprocess.py). The checkpoint holds both processes' files."""
    out = tmp_path / "two"
    _run(_launch(2, [*SYNC, "--train.stop_after=3"], out))
    assert _steps(out) == [3]
    state = out / "checkpoints" / "3" / "state"
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(os.listdir(state))
    meta = json.loads((out / "checkpoints" / "3" / "meta" / "metadata").read_text())
    assert meta["integrity"]["checksum"] == "wsum32"
    _run(_launch(2, [*SYNC, "--resume"], out))
    _run(_train([*SYNC, "--devices", "2"], tmp_path / "ref"))
    _assert_same(_state(tmp_path / "ref"), _state(out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 3 and summary["steps"] == 6


LONG = ["--algo", "sync", "--steps", "8"]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """A 2-process sync run stopped at step 4 (its checkpoint), and the uninterrupted one."""
    d = tmp_path_factory.mktemp("pod")
    _run(_launch(2, [*LONG, "--train.stop_after=4"], d / "stopped"))
    _run(_launch(2, LONG, d / "ref"))
    return d


@pytest.mark.slow
def test_resume_on_four_processes_with_another_mesh_and_on_one(two_process_runs, tmp_path):
    """The step-4 checkpoint of 2 processes (data=2) resumed by 4 processes on data=2,model=2
    (tables split over model, fused, on other devices) and by 1 process with 1 device: each
    reads its own blocks and trains steps 5-8. The dense gradient is then summed over 4
    devices, or taken on 1, instead of 2: float rounding of another summation order, so
    rtol=1e-5, atol=1e-6 (the largest difference seen: 3.2e-7)."""
    d = two_process_runs
    ref = _state(d / "ref")
    four, one = tmp_path / "four", tmp_path / "one"
    for dst in (four, one):
        _copy_checkpoint(d / "stopped", dst, 4)
    _run(_launch(4, [*LONG, "--devices", "4", "--mesh", "data=2,model=2",
                     "--spmd.table_rules=emb/C1:table_wise;emb/C2:column_wise", "--resume"], four))
    _run(_train([*LONG, "--resume"], one))
    for out in (four, one):
        _assert_same(ref, _state(out), rtol=1e-5, atol=1e-6)
        assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == 4


@pytest.mark.slow
def test_two_process_sync_to_gba_and_back(two_process_runs, tmp_path):
    """GBA's hand-over (Su et al. 2022, Sec. 4.1) from a multi-process sync checkpoint: GBA
    (one process, the single-device layout) resumes the 2-process step-4 checkpoint and trains
    to 8, then 2 processes of sync resume GBA's (a CRC-32 checkpoint of one process) to 12.
    The global step goes on and the Adam count equals the updates applied."""
    out = tmp_path / "handover"
    _copy_checkpoint(two_process_runs / "stopped", out, 4)
    _run(_train(["--algo", "gba", "--steps", "8", "--resume"], out))
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == 4
    _run(_launch(2, ["--algo", "sync", "--steps", "12", "--resume"], out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 8 and summary["steps"] == 12
    counts = [v for k, v in _state(out).items() if "opt_state" in k and v.ndim == 0]
    assert counts and all(int(c) == 12 for c in counts), counts


def _children(launcher, n, timeout=60):
    """The pids of launch.py's `n` processes, by process id."""
    import psutil

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        kids = {}
        for c in psutil.Process(launcher.pid).children():
            for a in c.cmdline():
                if a.startswith("--spmd.process_id="):
                    kids[int(a.split("=")[1])] = c.pid
        if len(kids) == n:
            return kids
        time.sleep(0.2)
    raise AssertionError("launch.py did not start its processes")


def _wait_for_checkpoint(out, n, proc, timeout=240):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        if (out / "checkpoints").is_dir() and len(_steps(out)) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {n} checkpoints in {out}")


STOPPABLE = ["--algo", "sync", "--steps", "2000", "--train.ckpt_every=10"]


@pytest.mark.slow
def test_sigterm_to_one_process_stops_all_at_one_step(tmp_path):
    """SIGTERM (a scheduler's preemption) to process 1 only: both processes stop at the same
    step boundary, write one checkpoint of that step together, and exit 130. Resumed to the
    step after, the run equals the uninterrupted one bit for bit."""
    out = tmp_path / "run"
    log = open(tmp_path / "log", "w")  # noqa: SIM115
    p = subprocess.Popen(_launch(2, STOPPABLE, out, grace=60), cwd=ROOT, env=ENV, stdout=log,
                         stderr=subprocess.STDOUT, text=True)
    try:
        kids = _children(p, 2)
        _wait_for_checkpoint(out, 1, p)
        os.kill(kids[1], signal.SIGTERM)
        assert p.wait(120) == 130
    finally:
        if p.poll() is None:
            p.kill()
    text = (tmp_path / "log").read_text()
    stops = [ln for ln in text.splitlines() if ln.startswith("stopped at step")]
    at = {int(s.split()[3].split("/")[0]) for s in stops}
    assert len(stops) == 2 and len(at) == 1, text[-3000:]
    step = at.pop()
    assert _steps(out)[-1] == step and "Traceback" not in text
    end = ["--algo", "sync", "--steps", str(step + 2)]
    _run(_launch(2, [*end, "--resume"], out))
    _run(_train([*end, "--devices", "2"], tmp_path / "ref"))
    _assert_same(_state(tmp_path / "ref"), _state(out))


@pytest.mark.slow
def test_kill_9_of_one_process_stops_the_other_with_the_checkpoints_intact(tmp_path):
    """kill -9 of process 1: process 0, waiting for it in a collective, is stopped by
    jax.distributed's heartbeat (``--spmd.heartbeat_timeout=10``) before launch.py's grace
    (60 s) runs out; every checkpoint committed before the kill is still there and the run
    resumes from the newest."""
    out = tmp_path / "run"
    p = subprocess.Popen(_launch(2, [*STOPPABLE, "--spmd.heartbeat_timeout=10"], out, grace=60),
                         cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        kids = _children(p, 2)
        _wait_for_checkpoint(out, 2, p)
        before = _steps(out)
        os.kill(kids[1], signal.SIGKILL)
        t = time.monotonic()
        code = p.wait(120)
        stopped = time.monotonic() - t
    finally:
        if p.poll() is None:
            p.kill()
    assert code != 0 and stopped < 30, (code, stopped)  # the heartbeat, not the grace
    after = _steps(out)
    assert after[-1] >= before[-1]
    _run(_launch(2, ["--algo", "sync", "--steps", str(after[-1] + 2), "--resume"], out))
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == after[-1]


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["--algo", "des", "--model", "deepfm", "--steps", "6"],
    ["--algo", "diloco", "--steps", "6", "--diloco.inner_steps=3", "--train.ckpt_every=3"]])
def test_des_and_diloco_resume_bitwise(args, tmp_path):
    """DES (fields split over the processes) and DiLoCo (its outer state and each replica's
    inner state saved beside theta, `extra`) resume at 2 processes bit for bit."""
    out, ref = tmp_path / "run", tmp_path / "ref"
    _run(_launch(2, [*args, "--train.stop_after=3"], out))
    _run(_launch(2, [*args, "--resume"], out))
    _run(_launch(2, args, ref))
    _assert_same(_state(ref), _state(out))
