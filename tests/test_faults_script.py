"""scripts/faults.py end to end (issue 16's acceptance): random SIGKILL / SIGINT / SIGTERM /
double SIGINT during training and during saves, for single, sync and a deterministic host-async
algorithm, then resumes; no checkpoint lost, every final state bitwise the uninterrupted run's.
Slow (minutes): CI runs it (`make test-all`)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def faults(*args: str) -> subprocess.CompletedProcess:
    """scripts/faults.py run as a user runs it."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "faults.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=3000)


@pytest.mark.slow
def test_fault_cycles_lose_nothing_and_resume_bitwise(tmp_path):
    r = faults("--cycles", "3", "--seed", "1", "--workdir", str(tmp_path / "runs"),
               "--json", str(tmp_path / "report.json"))
    assert (tmp_path / "report.json").exists(), r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) == {"single", "sync", "shadow"}
    for algo, a in report.items():
        assert a["cycles"] >= 1, (algo, a)
        assert a["lost"] == 0 and a["bad_exits"] == 0 and a["bitwise_equal"], (algo, a)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.slow
def test_out_policy_cases_of_multi_process_runs(tmp_path):
    """Issue 40 item 3 in the fault script: 2-process runs into a used --out are refused by
    every process, the old files stay byte for byte, and no process is left."""
    r = faults("--out-cases", "--workdir", str(tmp_path / "runs"), "--timeout", "200")
    out = r.stdout
    report = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert r.returncode == 0 and report["refused"] == 2 == len(report["cases"]), r.stderr
    assert report["files_changed"] == 0 and report["processes_left"] == 0
