"""scripts/faults.py end to end (issue 16's acceptance): random SIGKILL / SIGINT / SIGTERM /
double SIGINT during training and during saves, for single, sync and a deterministic host-async
algorithm, then resumes; no checkpoint lost, every final state bitwise the uninterrupted run's.
Slow (minutes): CI runs it (`make test-all`)."""

import json

import pytest

from scripts import faults


@pytest.mark.slow
def test_fault_cycles_lose_nothing_and_resume_bitwise(tmp_path):
    code = faults.main(["--cycles", "3", "--seed", "1", "--workdir", str(tmp_path / "runs"),
                        "--json", str(tmp_path / "report.json")])
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) == {"single", "sync", "shadow"}
    for algo, r in report.items():
        assert r["cycles"] >= 1, (algo, r)
        assert r["lost"] == 0 and r["bad_exits"] == 0 and r["bitwise_equal"], (algo, r)
    assert code == 0


@pytest.mark.slow
def test_out_policy_cases_of_multi_process_runs(tmp_path, capsys):
    """Issue 40 item 3 in the fault script: 2-process runs into a used --out are refused by
    every process, the old files stay byte for byte, and no process is left."""
    code = faults.main(["--out-cases", "--workdir", str(tmp_path / "runs"), "--timeout", "200"])
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert code == 0 and report["refused"] == 2 == len(report["cases"])
    assert report["files_changed"] == 0 and report["processes_left"] == 0
