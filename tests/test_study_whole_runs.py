"""The study kit (recjax/study) on whole runs from scratch, with a stand-in for `algorithms.run`:
arms and sweeps per dataset, ratio and direction-only claims, per-dataset claims, facts about the
data, the report's tables and a doc's generated section; all against hand computations."""

import json
import math
import pathlib

import pytest

from recjax.study import Arm, Claim, Size, Study, Sweep, report, runner
from recjax.study.data import id_alpha

CAP = 1 << 20  # the smoke config's embed.capacity (an arm may set its own)
LENGTH = 30  # the stand-in's steps for train.steps = 0 (the config's length)
AUC = {"single": 0.70, "async": 0.68, "gba": 0.69}  # + seed / 1000; gba: - iota / 1000
EPS = {"single": 100.0, "async": 200.0, "gba": 150.0}  # examples/s; x (1 + seed / 10)

STUDY = Study(
    name="toy", title="toy", config="smoke", overrides={"train.batch_size": 64},
    datasets={"d1": {}, "d2": {"train.batch_size": 32}},
    arms=(Arm("ref", {"train.algo": "single"}), Arm("a", {"train.algo": "async"}),
          Arm("d2only", {"train.algo": "async", "embed.capacity": 7}, datasets=("d2",))),
    reference="ref",
    sweeps=(Sweep("iota", "gba.iota", {"quick": (0, 3), "full": (0, 1, 3)},
                  {"train.algo": "gba"}, datasets=("d1",)),),
    sizes={"quick": Size(base=0, chunk=0, chunks=1, seeds=(0, 1, 2))},
    claims=(Claim("a faster", "a", "ref", "greater", 2.6, "T1", metric="examples_per_sec",
                  scale="ratio"),
            Claim("a faster, smaller", "a", "ref", "greater", 1.5, "T1",
                  metric="examples_per_sec", scale="ratio"),
            Claim("iota hurts", "iota=3", "iota=0", "less", None, "Eq. 6"),
            Claim("a below ref on d2", "a", "ref", "less", -0.02, "T2", datasets=("d2",))),
    metrics=("examples_per_sec",),
    counters=("lru.total.evicted", "dense_staleness", "never"),
    describe=lambda cfg: {"batch": cfg.train.batch_size, "seed": cfg.train.seed,
                          "skipped": [1, 2]},
    overview=True,
)


class FakeRun:
    """Writes what a whole run writes (its last checkpoint, summary.json); every number is a
    function of the settings, so every record can be predicted."""

    def __init__(self):
        self.calls = []

    def __call__(self, cfg):
        tc = cfg.train
        self.calls.append((pathlib.Path(tc.out).name, tc.algo, cfg.gba.iota, tc.steps, tc.seed,
                           tc.resume, tc.batch_size, cfg.embed.capacity))
        steps = tc.steps or LENGTH
        (pathlib.Path(tc.out) / "checkpoints" / str(steps)).mkdir(parents=True)
        s = {"steps": steps, "resumed_from_step": None,
             "eval_auc": AUC[tc.algo] + tc.seed / 1e3 - (cfg.gba.iota / 1e3 if tc.algo == "gba"
                                                          else 0),
             "examples_per_sec": EPS[tc.algo] * (1 + tc.seed / 10),
             "lru": {"total": {"evicted": 5 + tc.seed}} if tc.algo == "async" else {},
             "dense_staleness": {"mean": 1, "max": 2, "histogram": {"0": 1, "2": 1}}}
        (pathlib.Path(tc.out) / "summary.json").write_text(json.dumps(s))
        return s


def _run(tmp_path, run=None):
    return runner.run_study(STUDY, "quick", str(tmp_path), run or FakeRun(), log=lambda s: None)


def test_every_arm_runs_from_scratch_on_its_datasets(tmp_path):
    run = FakeRun()
    res = _run(tmp_path, run)
    want = []
    for seed in (0, 1, 2):  # d1: ref, a, then the sweep's arms; steps 0 = the config's length
        want += [("ref", "single", 3, 0, seed, False, 64, CAP),
                 ("a", "async", 3, 0, seed, False, 64, CAP),
                 ("iota=0", "gba", 0, 0, seed, False, 64, CAP),
                 ("iota=3", "gba", 3, 0, seed, False, 64, CAP)]
    for seed in (0, 1, 2):  # d2: its own arm, its batch size, no sweep
        want += [("ref", "single", 3, 0, seed, False, 32, CAP),
                 ("a", "async", 3, 0, seed, False, 32, CAP),
                 ("d2only", "async", 3, 0, seed, False, 32, 7)]
    assert run.calls == want
    r = next(r for r in res["d1"] if r["arm"] == "a" and r["seed"] == 2)
    # the record: the metric, the other metrics, a dotted counter, a histogram, None for absent
    assert (r["step"], r["phase"], r["chunk"]) == (LENGTH, "forward", 1)
    assert r["eval_auc"] == pytest.approx(0.682) and r["examples_per_sec"] == pytest.approx(240)
    assert r["lru.total.evicted"] == 7 and r["dense_staleness"] == {"0": 1, "2": 1}
    assert r["never"] is None
    assert not (tmp_path / "work" / "d1" / "seed0" / "base").exists()


def test_a_whole_run_killed_before_its_record_is_read_back(tmp_path):
    _run(tmp_path)
    path = tmp_path / "d2" / "segments.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")  # d2only seed 2 finished, its record lost
    again = FakeRun()
    res = _run(tmp_path, again)
    assert again.calls == [] and len(res["d2"]) == len(lines)


def test_ratio_direction_and_per_dataset_claims_by_hand(tmp_path):
    res = _run(tmp_path)
    a_faster, smaller, iota, d2 = STUDY.claims
    # a / ref examples/s = 2 on every seed: log 2, zero spread
    assert report.claim_diffs(STUDY, res["d1"], a_faster) == pytest.approx([math.log(2)] * 3)
    v = {x["claim"]: x for x in report.verdicts(STUDY, res["d1"], "d1")}
    # the interval is x2 alone: it excludes the paper's x2.6 (did not hold) but not x1.5's side
    assert v["a faster"]["verdict"] == "did not hold" and v["a faster"]["mean"] == pytest.approx(2)
    assert v["a faster"]["scale"] == "ratio" and v["a faster"]["diffs"] == pytest.approx([2] * 3)
    assert v["a faster, smaller"]["verdict"] == "held"
    # iota 3 - iota 0 = -0.003 on every seed: a direction claim held
    assert report.claim_diffs(STUDY, res["d1"], iota) == pytest.approx([-0.003] * 3)
    assert v["iota hurts"]["verdict"] == "held" and v["iota hurts"]["paper"] is None
    assert "a below ref on d2" not in v  # scored on d2 only
    v2 = {x["claim"]: x for x in report.verdicts(STUDY, res["d2"], "d2")}
    assert set(v2) == {"a faster", "a faster, smaller", "a below ref on d2"}  # no sweep on d2
    assert v2["a below ref on d2"]["mean"] == pytest.approx(-0.02)


def test_direction_claims_did_not_hold_only_on_the_other_side():
    from recjax.study.stats import verdict

    assert verdict("less", None, [0.002, 0.003, 0.0025])[0] == "did not hold"
    assert verdict("less", None, [-0.002, 0.003, 0.0005])[0] == "unresolved"
    assert verdict("greater", None, [0.002, 0.003, 0.0025])[0] == "held"
    # a resolved effect of any size on the paper's side holds: there is no size to miss
    assert verdict("less", None, [-1e-6, -2e-6, -1.5e-6])[0] == "held"
    with pytest.raises(ValueError, match="margin"):
        verdict("within", None, [0.0, 0.1])


def test_the_report_of_whole_runs(tmp_path):
    res = _run(tmp_path)
    facts = {ds: runner.describe(STUDY, "quick", ds) for ds in res}
    assert facts["d2"] == {"batch": 32, "seed": 0, "skipped": [1, 2]}  # the reference, seed 0
    text = report.markdown(STUDY, res, "cmd", 1.0, facts)
    # overview: the facts, then each arm on every dataset (d2only is d2's alone: not a column)
    # ref: 0.70 + mean seed (0.001) = 0.7010, sd 0.001; a: 0.6810
    assert "| dataset | batch | seed | seeds | ref | a |" in text
    assert "| d1 | 64 | 0 | 3 | 0.7010 ± 0.0010 | 0.6810 ± 0.0010 |" in text
    assert "Data: batch 64, seed 0." in text
    # per arm: a - ref = -0.02 on every seed (sd 0); examples/s 200 x (1, 1.1, 1.2)
    assert "| a | 0.6810 ± 0.0010 | -0.0200 ± 0.0000 | 220 ± 20 |" in text
    assert "| ref | 0.7010 ± 0.0010 | - | 110 ± 10 |" in text
    # the sweep: iota 3 is 0.003 below iota 0; the counters it has (never: no column)
    assert "| iota | eval_auc | dense_staleness |" in text
    assert "| 3 | 0.6880 ± 0.0010 | 1.00 (2) |" in text
    # counters: lru.total.evicted = 5 + seed for async, mean over seeds 6
    assert "| a | 6 | 1.00 (2) |" in text and "| ref | - | 1.00 (2) |" in text
    assert "| a faster | x2.60 (T1) | x2.00 [x2.00, x2.00] | x1.00 | 3 | **did not hold** |" in text
    assert "after each chunk" not in text and "every arm trains from scratch" in text
    report.figure(STUDY, res, str(tmp_path / "fig"))
    assert (tmp_path / "fig.svg").exists() and (tmp_path / "fig.png").exists()


def test_a_doc_keeps_everything_outside_its_markers(tmp_path):
    doc = tmp_path / "toy.md"
    doc.write_text("# Toy\n\nprose\n\n<!-- toy-study:begin -->\nold\n<!-- toy-study:end -->\n\n"
                   "after\n")
    report.write_doc(str(doc), "toy", "`cmd`, 1 s.\n\n## d1\n\n### Claims\n| x |\n")
    assert doc.read_text() == ("# Toy\n\nprose\n\n<!-- toy-study:begin -->\n`cmd`, 1 s.\n\n"
                               "### d1\n\n#### Claims\n| x |\n<!-- toy-study:end -->\n\nafter\n")
    other = tmp_path / "other.md"
    other.write_text("# Other\n")  # no markers yet: the section goes at the end
    report.write_doc(str(other), "toy", "new\n")
    assert other.read_text() == "# Other\n\n<!-- toy-study:begin -->\nnew\n<!-- toy-study:end -->\n"


def test_sizes_and_studies_refuse_what_cannot_run():
    with pytest.raises(ValueError, match="chunk >= 1"):
        Size(base=10, chunk=0, chunks=1, seeds=(0,))  # the config's length needs no base run
    with pytest.raises(ValueError, match="chunk >= 1"):
        Size(base=0, chunk=0, chunks=2, seeds=(0,))
    with pytest.raises(ValueError, match="without a base run"):
        Size(base=0, chunk=5, chunks=3, back_at=1, seeds=(0,))
    arms = (Arm("ref"), Arm("a"))
    with pytest.raises(ValueError, match="not in the study's metrics"):
        Study("s", "s", "smoke", {}, {"d": {}}, arms, "ref", {},
              claims=(Claim("c", "a", "ref", "greater", 2.0, "T", metric="examples_per_sec",
                            scale="ratio"),))
    with pytest.raises(ValueError, match="unknown dataset"):
        Study("s", "s", "smoke", {}, {"d": {}}, (Arm("ref"), Arm("a", datasets=("e",))), "ref", {})
    with pytest.raises(ValueError, match="ratio"):
        Claim("c", "a", "ref", "greater", -2.0, "T", scale="ratio")


def test_id_alpha_counts_samples_per_id(tmp_path):
    """Theorem-1 alpha of a 4-row Criteo file: C1 is 'aaaa' in 3 rows (alpha 3/4), every other
    field distinct per row."""
    from recjax import configs
    from recjax.config import apply_overrides

    path = tmp_path / "t.tsv"
    path.write_text("".join("\t".join([str(i % 2), *[str(i)] * 13, "aaaa" if i < 3 else "bbbb",
                                       *(f"{i:02x}{j:02x}" for j in range(1, 26))]) + "\n"
                            for i in range(4)))
    cfg = apply_overrides(configs.get("criteo"), [("data.train", f"criteo:{path}"),
                                                  ("data.eval", f"criteo:{path}"),
                                                  ("train.batch_size", "2")])
    got = id_alpha(cfg)
    assert (got["id_alpha"], got["id_alpha_field"], got["samples"]) == (0.75, "C1", 4)
    assert got["distinct_ids_per_field"] == [2] + [4] * 25 and got["distinct_ids_max"] == 4


class ScaledRun(FakeRun):
    """FakeRun whose examples/s grow with runtime.trainers n: single x n, async x min(n, 2)."""

    def __call__(self, cfg):
        s = super().__call__(cfg)
        n = cfg.runtime.trainers
        s["examples_per_sec"] *= n if cfg.train.algo == "single" else min(n, 2)
        self.calls[-1] += (n,)
        (pathlib.Path(cfg.train.out) / "summary.json").write_text(json.dumps(s))
        return s


SCALING = Study(
    name="scale", title="scale", config="smoke", overrides={"train.batch_size": 64},
    datasets={"d1": {}, "d2": {}},
    arms=(Arm("ref", {"train.algo": "single"}),
          Arm("a", {"train.algo": "async", "train.steps": 7}),
          Arm("b", {"train.algo": "async"}, seeds=1)),
    reference="ref",
    sweeps=tuple(Sweep("n", "runtime.trainers", {"quick": (1, 2, 4)}, {"train.algo": algo},
                       datasets=("d1",), variant=algo, scaled={"train.steps": {"quick": 10}},
                       metrics=("examples_per_sec", "eval_auc")) for algo in ("single", "async")),
    sizes={"quick": Size(base=0, chunk=0, chunks=1, seeds=(0, 1),
                         overrides={"train.batch_size": 48},
                         datasets={"d2": {"train.batch_size": 32}})},
    claims=(Claim("single flat", "single n=4", "single n=1", "within", 1.1, "F5",
                  metric="examples_per_sec", scale="ratio"),
            Claim("async flat", "async n=4", "async n=2", "within", 1.1, "F5",
                  metric="examples_per_sec", scale="ratio")),
    metrics=("examples_per_sec",),
)


def test_per_dataset_sizes_own_lengths_and_weak_scaling_sweeps(tmp_path):
    run = ScaledRun()
    res = runner.run_study(SCALING, "quick", str(tmp_path), run, log=lambda s: None)
    # the size's batch (48) beats the study's, its d2 batch (32) the size's; arm a's own
    # train.steps is its length; each sweep arm runs 10 steps per trainer (the smoke config: 2)
    calls = {(c[0], c[4], c[6]): (c[1], c[3], c[-1]) for c in run.calls}
    assert calls[("ref", 0, 48)] == ("single", 0, 2) and calls[("a", 1, 32)] == ("async", 7, 2)
    assert calls[("single n=4", 1, 48)] == ("single", 40, 4)
    assert calls[("async n=2", 0, 48)] == ("async", 20, 2)
    # d1: 2 arms + 2 x 3 sweep arms per seed; d2: 2 arms; and b on the first seed only
    assert len(run.calls) == 2 * (2 + 6) + 2 * 2 + 2
    assert {(c[0], c[4]) for c in run.calls if c[0] == "b"} == {("b", 0)}
    assert {r["step"] for r in res["d1"] if r["arm"] == "a"} == {7}
    v = {x["claim"]: x for x in report.verdicts(SCALING, res["d1"], "d1")}
    # single n=4 / n=1 = x4 on both seeds: far outside x1.1; async n=4 / n=2 = x1: inside
    assert v["single flat"]["verdict"] == "did not hold"
    assert v["single flat"]["mean"] == pytest.approx(4)
    assert v["async flat"]["verdict"] == "held"
    text = report.markdown(SCALING, res, "cmd", 1.0)
    # one table per metric, a column per sweep: examples/s 100 x n x (1, 1.1) and 200 x min(n, 2)
    # x (1, 1.1): means 105 n and 210 min(n, 2), sds 7.07 n and 14.1 min(n, 2)
    assert "### examples_per_sec against n (`runtime.trainers`; mean ± sd over seeds)" in text
    assert "| n | single | async |" in text
    assert "| 1 | 105 ± 7 | 210 ± 14 |" in text and "| 4 | 420 ± 28 | 420 ± 28 |" in text
    assert "| 2 | 0.7005 ± 0.0007 | 0.6805 ± 0.0007 |" in text  # eval_auc: 0.70 / 0.68 + seed
    assert "| single flat | within x1.10 (F5) | x4.00 [x4.00, x4.00] |" in text
    report.figure(SCALING, res, str(tmp_path / "fig"))
    assert (tmp_path / "fig.svg").exists()


def test_sweeps_and_sizes_refuse_unknown_metrics_and_datasets():
    arms = (Arm("ref"),)
    with pytest.raises(ValueError, match="sweep n shows a metric not in"):
        Study("s", "s", "smoke", {}, {"d": {}}, arms, "ref", {},
              sweeps=(Sweep("n", "runtime.trainers", {}, metrics=("examples_per_sec",)),))
    with pytest.raises(ValueError, match="size quick names an unknown dataset"):
        Study("s", "s", "smoke", {}, {"d": {}}, arms, "ref",
              {"quick": Size(0, 0, 1, (0,), datasets={"e": {}})})
