"""The GBA study (scripts/compare_gba.py) at its smoke size: every mode continues the sync
checkpoint at its global step and reports finite AUCs and counters.

It runs in a subprocess because the study turns on jax's persistent compilation cache (every
--resume segment rebuilds its jitted functions), a process-wide setting."""

import json
import math
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~60 s on the 2-core box (cold compile cache in a subprocess)
def test_smoke_study_hands_over_the_global_step_and_reports_every_mode(tmp_path):
    from scripts import compare_gba

    subprocess.run([sys.executable, str(ROOT / "scripts" / "compare.py"), "gba", "--smoke",
                    "--datasets", "synthetic", "--out", str(tmp_path)], check=True,
                   capture_output=True, cwd=ROOT)
    res = json.loads((tmp_path / "gba_study.json").read_text())["results"]["synthetic"]
    base, chunk = res["schedule"]["base"], res["schedule"]["chunk"]  # 3, 2
    assert set(res["forward"]) == set(compare_gba.ARMS) and set(res["back"]) == set(compare_gba.MODES)
    for name, arm in res["forward"].items():
        assert arm["handover_resumed_from_step"] == base and arm["final_step"] == base + 2 * chunk
        assert [r["steps"] for r in arm["chunks"]] == [base + chunk, base + 2 * chunk]
        assert all(math.isfinite(r["eval_auc"]) for r in arm["chunks"])
        if name != "single":  # every data-list entry (M = 4 per step) applied or dropped
            assert arm["gradients_applied"] + arm["dropped_gradients"] == 4 * 2 * chunk
            assert arm["tokens_handed_out"] == 4 * 2 * chunk
    for arm in res["back"].values():
        assert [r["resumed_from_step"] for r in arm["chunks"]] == [base + chunk]
        assert math.isfinite(arm["chunks"][0]["eval_auc"])
    assert res["forward"]["sync"]["dense_staleness"]["max"] == 0
    text = (tmp_path / "gba_study.md").read_text()
    assert "| gba |" in text and "Verdicts" in text
    assert (tmp_path / "gba_switch.svg").exists() and (tmp_path / "gba_switch.png").exists()
