"""The ShadowSync study's verdict rules (scripts/shadowsync_verdicts.py) on hand-made numbers,
both ways, and the study end to end at its smoke size.

The rules the old study used, reproduced here as the bugs these tests catch:
* "S-EASGD as good as FR-EASGD" passed when S-EASGD was *worse* by up to 0.003 (PAR), four times
  the paper's whole Eval NE spread (0.0008): `test_lower_is_not_held_when_a_is_worse_within_old_par`.
* "quality degrades with k" was `NE(k=100) > NE(k=5)`, so 0.4574, 0.4539, 0.4537, 0.4538 (not
  monotonic) could pass: `test_increases_is_not_held_on_non_monotonic_means`.
* one seed: no noise estimate, a verdict flips between runs: `test_one_seed_is_refused`.
"""

import json
import math
import pathlib
import subprocess
import sys

import pytest

from scripts import shadowsync_report as sr
from scripts import shadowsync_verdicts as sv

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_summary_matches_hand_computed_mean_and_sample_sd():
    s = sv.summary([1.0, 2.0, 4.0])
    # mean 7/3; squared deviations 16/9 + 1/9 + 25/9 = 42/9; / (n-1) = 21/9
    assert s["mean"] == pytest.approx(7 / 3) and s["sd"] == pytest.approx(math.sqrt(21 / 9))
    assert (s["min"], s["max"], s["n"]) == (1.0, 4.0, 3)


def test_lower_is_held_when_every_seed_agrees_beyond_noise():
    a = [0.790, 0.792, 0.788]
    b = [0.795, 0.796, 0.794]  # d = .005, .004, .006: mean .005, sd .001, SE .000577
    v = sv.lower(a, b)
    assert v["verdict"] == sv.HELD
    assert v["mean"] == pytest.approx(0.005) and v["se"] == pytest.approx(0.001 / math.sqrt(3))


def test_lower_is_not_held_within_noise():
    a = [0.790, 0.792, 0.788]
    b = [0.791, 0.790, 0.790]  # d = +.001, -.002, +.002: mean .000333, SE .00120
    v = sv.lower(a, b)
    assert v["verdict"] == sv.NOT_HELD and v["reason"] == "within noise"


def test_lower_pairs_by_seed_not_by_pooled_spread():
    # Seed-to-seed spread (0.01) dwarfs the effect, but every seed shows b - a = 0.001 +- 0.0001:
    # pairing by seed is what lets a small, consistent effect count.
    a = [0.80, 0.81, 0.79, 0.82]
    b = [0.8011, 0.8109, 0.7910, 0.8210]
    assert sv.lower(a, b)["verdict"] == sv.HELD
    # the same values with b's seeds shuffled are no longer a consistent difference
    assert sv.lower(a, [b[1], b[2], b[3], b[0]])["verdict"] == sv.NOT_HELD


def test_lower_is_not_held_when_a_is_worse_within_old_par():
    a = [0.7965, 0.7967, 0.7963]  # S-EASGD worse than FR by 0.002 < the old PAR = 0.003
    b = [0.7945, 0.7946, 0.7944]
    v = sv.lower(a, b)
    assert v["verdict"] == sv.NOT_HELD and v["reason"].startswith("reversed")


def test_one_seed_is_refused():
    with pytest.raises(ValueError, match="--seeds 2 or more"):
        sv.lower([0.79], [0.80])
    with pytest.raises(ValueError, match="same seeds"):
        sv.lower([0.79, 0.78], [0.80])


def test_increases_is_held_on_monotonic_means_beyond_noise():
    by_k = {5: [0.7963, 0.7960, 0.7966], 10: [0.8000, 0.7998, 0.8003],
            30: [0.8109, 0.8101, 0.8112], 100: [0.8257, 0.8250, 0.8261]}
    v = sv.increases(by_k)
    assert v["verdict"] == sv.HELD
    assert list(v["means"]) == [5, 10, 30, 100]


def test_increases_is_not_held_on_non_monotonic_means():
    # the old doc's Frappe column: the endpoints rise, but k=10 and k=30 go down
    by_k = {5: [0.4574, 0.4570, 0.4578], 10: [0.4539, 0.4541, 0.4537],
            30: [0.4537, 0.4535, 0.4539], 100: [0.4538, 0.4600, 0.4620]}
    v = sv.increases(by_k)
    assert v["verdict"] == sv.NOT_HELD and "k=5->10" in v["reason"] and "k=10->30" in v["reason"]


def test_increases_is_not_held_when_monotonic_but_within_noise():
    by_k = {5: [0.80, 0.81, 0.79], 10: [0.8001, 0.8101, 0.7901], 100: [0.805, 0.795, 0.8005]}
    v = sv.increases(by_k)  # means .8, .80010, .80017: rising, but the k=100 - k=5 SE is ~.0058
    assert v["verdict"] == sv.NOT_HELD and "within 2 SE" in v["reason"]


def test_fr_cap_is_k_over_exchange_iterations_trainers():
    # one exchange = 2 iterations: k = 5 admits 2.5 trainers' worth, k = 30 fifteen
    assert sv.fr_cap(5, 2.0, 50_000.0) == pytest.approx(125_000.0)
    assert sv.fr_cap(30, 2.0, 50_000.0) == pytest.approx(750_000.0)


def _fake_results(seeds, s_easgd_shift):
    """A hand-made results.json: FR NE rises with k; S-EASGD = FR k=5 + shift."""
    ds = {}
    for i, s in enumerate(seeds):
        noise = 0.0002 * ((-1) ** i) * (i + 1)
        row = {}
        for name, ne in (("FR-EASGD k=5", 0.796), ("FR-EASGD k=10", 0.800),
                         ("FR-EASGD k=30", 0.811), ("FR-EASGD k=100", 0.826),
                         ("S-MA", 0.794), ("FR-MA k=10", 0.798), ("S-BMUF", 0.7931),
                         ("FR-BMUF k=10", 0.7931)):
            row[name] = {"train_ne": ne + 0.03 + noise, "eval_ne": ne + noise, "eval_auc": 0.79,
                         "gap": 4.0 if name.startswith("S-") else 10.0, "steps": 2048}
        # S-BMUF: FR-BMUF's NE plus a seed-dependent jitter of its own (mean ~0: within noise)
        row["S-BMUF"]["eval_ne"] = 0.7931 + noise + (0.0003, -0.0003, 0.0002)[i]
        row["S-EASGD"] = {**row["FR-EASGD k=5"], "eval_ne": 0.796 + noise + s_easgd_shift,
                          "train_ne": 0.826 + noise + s_easgd_shift, "gap": 3.9}
        ds[str(s)] = row
    one = 50_000.0
    ns = [1, 2, 4, 8, 16]
    scaling = {"trainers": ns, "exchange_iters": 2.0, "sync_gbps": 0.1, "seed": seeds[0],
               "eps": {"S-EASGD": [n * one for n in ns], "no sync": [n * one for n in ns],
                       "FR-EASGD k=5": [min(n, 2.4) * one for n in ns],
                       "FR-EASGD k=30": [min(n, 14.9) * one for n in ns]},
               "gap": {name: [2.0 * n + 2 for n in ns] for name in
                       ("S-EASGD", "no sync", "FR-EASGD k=5", "FR-EASGD k=30")}}
    return {"seeds": seeds, "size": "full", "commit": "abc", "command": "cmd", "wall_seconds": 1.0,
            "datasets": {"synthetic": ds}, "scaling": scaling}


def test_report_verdicts_both_ways_on_hand_made_results(tmp_path):
    better = {r["id"]: r for r in sr.verdicts(_fake_results([0, 1, 2], -0.001))}
    worse = {r["id"]: r for r in sr.verdicts(_fake_results([3, 4, 5], +0.001))}
    for metric in ("eval_ne", "train_ne"):
        assert better[f"synthetic/s-easgd-lower-{metric}"]["verdict"] == sv.HELD
        assert worse[f"synthetic/s-easgd-lower-{metric}"]["verdict"] == sv.NOT_HELD
    assert better["synthetic/fr-eval-ne-rises-with-k"]["verdict"] == sv.HELD
    assert better["synthetic/s-ma-lower"]["verdict"] == sv.HELD  # 0.004 lower on every seed
    assert better["synthetic/s-bmuf-lower"]["verdict"] == sv.NOT_HELD  # FR - S = -.0003, .0003, -.0002
    assert better["scaling/s-easgd-linear"]["verdict"] == sv.HELD
    assert better["scaling/fr5-capped"]["verdict"] == sv.HELD  # 2.4x of 16
    assert better["scaling/fr30-linear"]["verdict"] == sv.HELD  # 14.9 / 16 = 0.93 >= 0.9
    assert better["scaling/s-easgd-syncs-more-than-fr30"]["verdict"] == sv.NOT_HELD  # gap 34
    assert all(better[i]["by_construction"] for i in better if i.startswith("scaling/"))
    sr.write(tmp_path / "doc.md", _fake_results([0, 1, 2], -0.001), _fake_results([3, 4, 5], 0.001))
    text = (tmp_path / "doc.md").read_text()
    assert "| `synthetic/s-easgd-lower-eval_ne` | held | not held | **no** |" in text
    # S-EASGD eval NE: 0.795 + (.0002, -.0004, .0006): mean .795133, sample sd .000503
    assert "| S-EASGD | 0.8251 ± 0.0005 | 0.7951 ± 0.0005 |" in text
    assert (tmp_path / "shadowsync_scaling.svg").exists()
    assert (tmp_path / "shadowsync_scaling.png").exists()


@pytest.mark.slow  # ~2 min on the loaded 2-core box: 9 variants x 2 seeds + 8 scaling runs, tiny data
def test_smoke_study_writes_results_to_out_only(tmp_path):
    docs_before = {p: p.stat().st_mtime for p in (ROOT / "docs").iterdir()}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "compare.py"), "shadowsync", "--smoke",
                    "--seeds", "2", "--out", str(tmp_path), "--compile-cache",
                    str(tmp_path / "jax_cache")], check=True, capture_output=True,
                   cwd=ROOT)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["seeds"] == [0, 1] and res["partial"] is False
    cells = res["datasets"]["synthetic"]
    assert set(cells) == {"0", "1"}
    assert cells["0"]["S-EASGD"]["eval_ne"] != cells["1"]["S-EASGD"]["eval_ne"]  # seeds differ
    assert all(math.isfinite(c["eval_ne"]) for s in cells.values() for c in s.values())
    for f in ("shadowsync.md", "shadowsync_scaling.png", "shadowsync_scaling.svg"):
        assert (tmp_path / f).exists()
    assert {p: p.stat().st_mtime for p in (ROOT / "docs").iterdir()} == docs_before
