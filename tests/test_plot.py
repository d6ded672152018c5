"""scripts/plot.py: one styled line per run in a non-empty SVG (and a PNG), the right x values."""

import json
import pathlib
import re

import numpy as np
import pytest

from recjax.tools import plot


def _run(d: pathlib.Path, algo: str, ne: list[float], virtual: bool, **summary) -> pathlib.Path:
    d.mkdir()
    recs = []
    for i, v in enumerate(ne, 1):
        t = {"virtual_seconds": 0.5 * i} if virtual else {}
        recs.append({"kind": "train", "step": 10 * i, "examples": 10 * i * 32, "loss": v,
                     "train_ne": v + 0.1, "wall": 100.0 + i, **t})
        recs.append({"kind": "counters", "step": 10 * i, "avg_sync_gap": 2.0 + i})
        recs.append({"kind": "eval", "step": 10 * i, "ne": v, "auc": 0.7})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.json").write_text(json.dumps({"algorithm": algo, "batch_size": 32, **summary}))
    return d


def test_one_line_per_run_in_svg_and_png(tmp_path):
    runs = [_run(tmp_path / "a", "shadow", [0.9, 0.8, 0.7], True, sync_rule="easgd"),
            _run(tmp_path / "b", "fr", [0.95, 0.85, 0.75], True, sync_rule="easgd", sync_gap_k=5),
            _run(tmp_path / "c", "shadow", [0.92, 0.82, 0.72], True, sync_rule="bmuf")]
    out = tmp_path / "fig" / "ne.svg"
    assert plot.main([*map(str, runs), "--y", "eval_ne", "--x", "examples", "--logx",
                      "--out", str(out)]) == 0
    svg = out.read_text()
    assert len(svg) > 1000 and (out.with_suffix(".png")).stat().st_size > 1000
    assert sorted(re.findall(r'id="(run-\d+)"', svg)) == ["run-0", "run-1", "run-2"]
    for name in ("S-EASGD", "FR-EASGD k=5", "S-BMUF", "training examples", "eval NE"):
        assert name in svg, name  # text kept as text (svg.fonttype none): legend and axes


def test_x_values(tmp_path):
    wall = _run(tmp_path / "w", "async", [0.9, 0.8], False)
    virt = _run(tmp_path / "v", "async", [0.9, 0.8], True)
    xs, ys, unit = plot.load(wall, "eval_ne", "examples")
    np.testing.assert_array_equal(xs, [320, 640])
    np.testing.assert_array_equal(ys, [0.9, 0.8])
    assert unit == "training examples"
    xs, _, unit = plot.load(wall, "train_ne", "seconds")
    np.testing.assert_array_equal(xs, [101.0, 102.0])
    assert unit == "wall seconds"
    xs, ys, unit = plot.load(virt, "avg_sync_gap", "seconds")
    np.testing.assert_array_equal(xs, [0.5, 1.0])
    np.testing.assert_array_equal(ys, [3.0, 4.0])
    assert unit == "virtual seconds"
    with pytest.raises(SystemExit, match="no record has 'eval_gap'.*eval_ne"):
        plot.load(wall, "eval_gap", "step")


def test_days(tmp_path):
    """--x day: the kind: day records (the latest per day), at the day evaluated; switched days
    shaded; the day's Bayes NE with --y eval_ne."""
    d = _run(tmp_path / "days", "single", [0.9], False)
    days = [(0, "single", 0.70), (1, "gba", 0.71), (1, "gba", 0.72), (2, "single", 0.73)]
    with open(d / "metrics.jsonl", "a") as f:
        for day, algo, auc in days:
            f.write(json.dumps({"kind": "day", "day": day, "eval_day": day + 1, "step": 4 * day,
                                "algorithm": algo, "eval_auc": auc, "eval_ne": 1 - auc,
                                "bayes_eval_ne": 0.5 + day / 100}) + "\n")
    xs, ys, unit = plot.load(d, "eval_auc", "day")
    np.testing.assert_array_equal(xs, [1, 2, 3])
    np.testing.assert_array_equal(ys, [0.70, 0.72, 0.73])
    assert unit.startswith("day evaluated")
    out = tmp_path / "days.svg"
    assert plot.main([str(d), "--x", "day", "--y", "eval_ne", "--out", str(out)]) == 0
    svg = out.read_text()
    assert "trained with another algorithm" in svg and "Bayes-optimal NE of the day" in svg
    with pytest.raises(SystemExit, match="no kind: day record"):
        plot.load(_run(tmp_path / "none", "single", [0.9], False), "eval_auc", "day")
