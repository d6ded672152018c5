"""The Ray backend's processes (``--backend ray`` from the CLI): a run starts its own local
Ray instance in a subprocess and leaves no process of it behind, after kill -9'd actors or a
Ctrl-C (docs/distributed.md §4). Each test marks its subprocess's environment and scans /proc
for the mark. Slow (``make test-all``): Ray's start and the actors' JAX imports.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ray_processes(mark: str) -> list[str]:
    """Processes on this host whose environment carries `mark`: the test's driver and
    everything it started (raylet, GCS, workers, actors inherit the environment)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"RECJAX_TEST_MARK={mark}".encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}: {cmd[:120]}")
        except OSError:
            continue
    return out


LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def listening(mark: str) -> list[tuple[str, int, str]]:
    """(ip, port, process name) of every TCP socket listening in a process marked `mark`."""
    import psutil

    out = []
    for line in ray_processes(mark):
        pid = int(line.split(":")[0])
        try:
            proc = psutil.Process(pid)
            conns = getattr(proc, "net_connections", proc.connections)(kind="tcp")
            name = proc.name()
        except psutil.Error:  # exited meanwhile
            continue
        out += [(c.laddr.ip, c.laddr.port, name) for c in conns
                if c.status == psutil.CONN_LISTEN]
    return out


def _train(args: list[str], mark: str, log) -> subprocess.Popen:
    """scripts/train.py in a subprocess marked `mark`, its output into the file `log`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", RECJAX_TEST_MARK=mark)
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "train.py"), *args],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _finish(p: subprocess.Popen, log_path, timeout: float) -> str:
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    return open(log_path).read()


def _no_process_left(mark: str) -> None:
    deadline = time.time() + 20  # Ray's own processes exit asynchronously after shutdown
    while ray_processes(mark) and time.time() < deadline:
        time.sleep(0.5)
    assert ray_processes(mark) == []


@pytest.mark.slow
def test_cli_run_leaves_no_process(tmp_path):
    """The CLI starts its own Ray instance and stops every process of it, with a kill -9'd
    worker and PS shard on the way."""
    mark = f"cli-{os.getpid()}-{time.time()}"
    out, log_path = tmp_path / "run", tmp_path / "log"
    with open(log_path, "w") as log:
        p = _train(["--algo", "async", "--backend", "ray", "--config", "smoke", "--steps", "60",
                    "--trainers", "2", "--workers-per-trainer", "1", "--ray.kill",
                    "worker:1@4,ps:0@6", "--ray.snapshot_every", "2", "--out", str(out)], mark,
                   log)
    log = _finish(p, log_path, 300)
    assert p.returncode == 0, log
    s = json.loads((out / "summary.json").read_text())
    assert s["ps_restarts"] == 1 and len(s["lost_roles"]) == 1
    _no_process_left(mark)


@pytest.mark.slow
def test_ctrl_c_stops_every_actor_and_leaves_a_checkpoint(tmp_path):
    """SIGINT mid-run: exit 130, a checkpoint that threads resume, no Ray process left; and
    while it runs, no process of the local instance listens on a non-loopback address."""
    mark = f"sigint-{os.getpid()}-{time.time()}"
    out, log_path = tmp_path / "run", tmp_path / "log"
    with open(log_path, "w") as log:
        p = _train(["--algo", "async", "--backend", "ray", "--config", "smoke", "--steps",
                    "100000", "--trainers", "2", "--workers-per-trainer", "1", "--out", str(out),
                    "--stragglers", "slow:k=2,factor=3"], mark, log)
    deadline = time.time() + 240
    metrics = out / "metrics.jsonl"
    while time.time() < deadline and p.poll() is None:  # until the roles report progress
        if metrics.exists() and '"progress"' in metrics.read_text():
            break
        time.sleep(0.5)
    time.sleep(2)
    try:  # the local instance faces no network: GCS, raylet, workers, actors and the
        # metrics endpoint listen on loopback only (ray 2.60 otherwise binds :: and 0.0.0.0)
        ports = listening(mark)
        assert len(ports) >= 4, ports  # GCS, raylet, the actors: the listing itself works
        assert [x for x in ports if x[0] not in LOOPBACK] == [], ports
    finally:  # a failed check must not leave a 100000-step run behind
        p.send_signal(signal.SIGINT)
    log = _finish(p, log_path, 120)
    assert p.returncode == 130, log
    ckpts = [d for d in os.listdir(out / "checkpoints") if d.isdigit()]
    assert ckpts, log
    _no_process_left(mark)
    step = max(map(int, ckpts))
    # the stop's checkpoint: the shard actors wrote their tables (parts), the driver the rest
    meta = json.loads((out / "checkpoints" / str(step) / "meta" / "metadata").read_text())
    assert [p["item"] for p in meta["integrity"]["parts"]] == ["tables_0", "tables_1"], meta
    with open(log_path, "w") as log:
        r = _train(["--algo", "async", "--config", "smoke", "--steps", str(step + 20),
                    "--trainers", "2", "--workers-per-trainer", "1", "--out", str(out),
                    "--resume"], mark, log)
    log = _finish(r, log_path, 300)
    assert r.returncode == 0, log
    assert json.loads((out / "summary.json").read_text())["steps"] == step + 20


@pytest.mark.slow
def test_deaths_of_rays_own_processes(tmp_path):
    """Issue 40 item 6, through scripts/faults.py --ray-cases: kill -9 of GBA's PS0 actor, the
    raylet, GCS and the driver while a Ray run trains its second checkpoint interval, and of
    GCS while the run sets up (Ray alone ends the driver 60 s later; the intervals of a run
    share one runtime, so the run's start is its only set-up). PS0 and the raylet take the
    state with them: a one-line error naming the process and the latest committed checkpoint;
    GCS leaves the actors: the run checkpoints them first; the driver: its reaper kills the
    rest. Every case: no traceback, stopped within seconds, no committed checkpoint lost, the
    newest resumes on threads, no process left."""
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "faults.py"),
                        "--ray-cases", "all", "--workdir", str(tmp_path / "runs"),
                        "--timeout", "240", "--json", str(report)],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800)
    cases = {c["victim"]: c for c in json.loads(report.read_text())["cases"]}
    assert set(cases) == {"ps0", "raylet", "gcs", "driver", "gcs_setup"}, r.stdout + r.stderr
    for c in cases.values():
        assert c["killed"] and not c["traceback"] and not c["lost"], c
        assert c["processes_left"] == 0, c
        assert c["resumed"] or c["victim"] == "gcs_setup", c
        assert c["stopped_s"] < 30, c  # Ray alone: 60 s after GCS, minutes for the agents
    for name, what in (("ps0", "the Ray actor of GbaServer"), ("raylet", "Ray's raylet")):
        c = cases[name]
        assert c["exit"] == 2 and c["error"].startswith(f"error: {what}"), c
        assert f"latest committed checkpoint is step {c['committed_before'][-1]}" in c["error"]
        assert c["committed_after"] == c["committed_before"], c
    gcs = cases["gcs"]
    assert gcs["exit"] == 2 and "GCS server" in gcs["error"], gcs
    assert gcs["committed_after"][-1] > gcs["committed_before"][-1], gcs  # the stop's own
    setup = cases["gcs_setup"]  # no role ran: nothing to save, nothing committed
    assert setup["exit"] == 2 and "GCS server" in setup["error"], setup
    assert setup["committed_after"] == setup["committed_before"] == [], setup
    assert cases["driver"]["exit"] == -9
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
