"""The study kit's runner and report (recjax/study) with a stand-in for `algorithms.run`: which
segments run, in what order, with which settings, from which checkpoint; skip and resume; the
claims' paired differences against a hand computation."""

import dataclasses
import json
import pathlib

import pytest

import recjax.study as study_kit
from recjax.study import Arm, Claim, Size, Study, load, report, runner
from tests.conftest import smoke_study

ROOT = pathlib.Path(__file__).resolve().parents[1]
STUDY = Study(
    name="toy", title="toy", config="smoke", overrides={"train.batch_size": 64},
    datasets={"synthetic": {}},
    arms=(Arm("ref", {"train.algo": "single"}), Arm("a", {"train.algo": "async"}),
          Arm("b", {"train.algo": "gba", "gba.mode": "bsp"})),
    reference="ref",
    sizes={"quick": Size(base=10, chunk=5, chunks=3, back_at=1, seeds=(0, 1, 2))},
    claims=(Claim("a below ref", "a", "ref", "less", -0.01, "T1"),
            Claim("b back within ref", "b", "ref", "within", 0.05, "T2", phase="back")),
    counters=("updates",),
)
BONUS = {"single": 0.0, "async": -0.02, "gba": 0.01}  # per algo; the seed adds seed / 1000


class FakeRun:
    """Writes what a run writes (a committed checkpoint dir, summary.json); the metric is a
    function of the algorithm, the steps and the seed, so every record can be predicted."""

    def __init__(self, fail_at=None):
        self.calls, self.fail_at = [], fail_at

    def __call__(self, cfg):
        tc = cfg.train
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise KeyboardInterrupt
        ckpts = pathlib.Path(tc.out) / "checkpoints"
        have = sorted(int(p.name) for p in ckpts.iterdir()) if ckpts.exists() else []
        assert tc.resume == bool(have), (tc.out, tc.resume, have)
        self.calls.append((tc.out, tc.algo, cfg.gba.mode, tc.steps, tc.seed, tc.resume,
                           tc.batch_size, have[-1] if have else None))
        (ckpts / str(tc.steps)).mkdir(parents=True)
        s = {"steps": tc.steps, "resumed_from_step": have[-1] if have else None,
             "eval_auc": 0.7 + BONUS[tc.algo] + tc.steps / 1e4 + tc.seed / 1e3, "updates": 2}
        (pathlib.Path(tc.out) / "summary.json").write_text(json.dumps(s))
        return s


def test_segments_run_in_order_from_the_right_checkpoints(tmp_path):
    run = FakeRun()
    res = runner.run_study(STUDY, "quick", str(tmp_path), run, log=lambda s: None)["synthetic"]
    # per seed: base 10; each arm 15, 20, 25 from a copy of base; a and b back at 20, 25
    want = []
    for seed in (0, 1, 2):
        w = str(tmp_path / "work" / "synthetic" / f"seed{seed}")
        want.append((f"{w}/base", "single", "gba", 10, seed, False, 64, None))
        for name, algo, mode in (("ref", "single", "gba"), ("a", "async", "gba"),
                                 ("b", "gba", "bsp")):
            for j, steps in enumerate((15, 20, 25)):
                want.append((f"{w}/{name}", algo, mode, steps, seed, True, 64, 10 + 5 * j))
        for name in ("a", "b"):
            for steps in (20, 25):  # the back copy starts at chunk 1's step 15, under ref
                want.append((f"{w}/{name}-back", "single", "gba", steps, seed, True, 64,
                             steps - 5))
    assert run.calls == want
    assert len(res) == 3 * (1 + 3 * 3 + 2 * 2)
    # the claims' per-seed differences, by hand: a - ref = -0.02 on every chunk and seed
    c_a, c_b = STUDY.claims
    assert report.claim_diffs(STUDY, res, c_a) == pytest.approx([-0.02] * 3)
    # b's back chunks run single again: b-back - ref(forward) = 0
    assert report.claim_diffs(STUDY, res, c_b) == pytest.approx([0.0] * 3, abs=1e-12)
    v = {x["claim"]: x["verdict"] for x in report.verdicts(STUDY, res)}
    # zero spread: the interval is the mean alone (held), the equivalence exact (held)
    assert v == {"a below ref": "held", "b back within ref": "held"}
    text = report.markdown(STUDY, {"synthetic": res}, "cmd", 1.0)
    # a: 0.7 - 0.02 + steps / 1e4 + mean seed / 1e3 at steps 15, 20, 25
    assert "| a | 0.6825 | 0.6830 | 0.6835 | -0.0200 |" in text
    assert "| a | 6 |" in text  # updates: 2 per chunk x 3 chunks, mean over seeds


def test_a_study_run_again_skips_what_it_finished_and_resumes_a_cut_one(tmp_path):
    once = runner.run_study(STUDY, "quick", str(tmp_path / "once"), FakeRun(), log=lambda s: None)
    cut = FakeRun(fail_at=17)
    with pytest.raises(KeyboardInterrupt):
        runner.run_study(STUDY, "quick", str(tmp_path / "cut"), cut, log=lambda s: None)
    # a kill can leave a half-written last record: it is dropped and its segment reruns
    path = tmp_path / "cut" / "synthetic" / "segments.jsonl"
    path.write_text(path.read_text() + '{"seed": 1, "arm"')
    again = FakeRun()
    got = runner.run_study(STUDY, "quick", str(tmp_path / "cut"), again, log=lambda s: None)
    assert len(cut.calls) + len(again.calls) == 3 * 14  # nothing ran twice
    strip = lambda rows: sorted((r["seed"], r["arm"], r["phase"], r["chunk"], r["eval_auc"])
                                for r in rows)
    assert strip(got["synthetic"]) == strip(once["synthetic"])
    assert runner.run_study(STUDY, "quick", str(tmp_path / "cut"), FakeRun(), log=lambda s: None)


def test_a_segment_whose_checkpoint_finished_is_read_back(tmp_path):
    """Killed after the segment's checkpoint and summary, before its record: not rerun."""
    run = FakeRun()
    runner.run_study(STUDY, "quick", str(tmp_path), run, log=lambda s: None)
    path = tmp_path / "synthetic" / "segments.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")  # the last record (seed 2, b back, 25) lost
    again = FakeRun()
    res = runner.run_study(STUDY, "quick", str(tmp_path), again, log=lambda s: None)
    assert again.calls == [] and len(res["synthetic"]) == len(lines)


def test_a_segment_stopped_between_its_checkpoint_and_its_summary_is_evaluated(tmp_path):
    """Killed after the segment's last checkpoint but before its summary.json: a host-async
    run refuses a checkpoint at its end ("raise --steps"), so the study could never go on
    (a fuzz pass of kill/rerun cycles found it stuck). The runner has the single-device
    trainer evaluate that checkpoint instead; the record says so, and keeps no rate or counter
    (those would be the zero-step evaluation's, not the segment's)."""
    run = FakeRun()
    runner.run_study(STUDY, "quick", str(tmp_path), run, log=lambda s: None)
    path = tmp_path / "synthetic" / "segments.jsonl"
    lost = lambda r: (r["seed"], r["arm"], r["phase"], r["step"]) == (2, "b", "forward", 25)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if not lost(r)))
    (tmp_path / "work" / "synthetic" / "seed2" / "b" / "summary.json").unlink()  # gba, bsp

    class Eval(FakeRun):  # what the single trainer does at a finished checkpoint
        def __call__(self, cfg):
            tc = cfg.train
            self.calls.append((tc.out, tc.algo, tc.steps, tc.resume))
            s = {"steps": tc.steps, "resumed_from_step": tc.steps, "updates": 0,
                 "eval_auc": 0.7 + tc.steps / 1e4 + tc.seed / 1e3}
            (pathlib.Path(tc.out) / "summary.json").write_text(json.dumps(s))
            return s

    again = Eval()
    res = runner.run_study(STUDY, "quick", str(tmp_path), again, log=lambda s: None)
    w = str(tmp_path / "work" / "synthetic" / "seed2" / "b")
    assert again.calls == [(w, "single", 25, True)]
    (last,) = [r for r in res["synthetic"] if lost(r)]
    assert last["evaluated_only"] and last["eval_auc"] == pytest.approx(0.7 + 0.0025 + 0.002)
    assert last["updates"] is None  # the segment's counters are not the evaluation's (0)


def test_the_gba_study_file_names_the_papers_effects():
    study = load(str(ROOT / "scripts" / "studies" / "gba.py"))
    effects = {(c.arm, c.phase): c.effect for c in study.claims if c.kind == "less"}
    # App. Tables 6.4 / 6.8, row "Average" (baseline - GBA)
    assert effects[("bsp", "forward")] == -0.0034 and effects[("hop_bs", "back")] == -0.0009
    assert {a.name for a in study.arms} == {"single", "gba", "sync", "async", "hop_bs", "bsp",
                                            "hop_bw", "gba mean=buffer"}
    buffer = study.arm("gba mean=buffer").overrides
    assert (buffer["gba.mode"], buffer["gba.embedding_mean"]) == ("gba", "buffer")
    assert {(c.phase, c.reference) for c in study.claims if c.arm == "gba mean=buffer"} == {
        ("forward", "single"), ("back", "single")}
    # issue 35's full size: 32 workers of 32 rows, b2 = b3 = 20% of them, 1M eval rows; the
    # baselines also at their own local batch (Table 5.1), on the same 1024 rows per step
    full = study.sizes["full"].overrides
    assert (full["gba.workers"], full["gba.local_batch_size"], full["train.batch_size"]) == (
        32, 32, 1024)
    assert (full["gba.b2"], full["gba.b3"], full["synthetic.n_eval"]) == (6, 6, 1_000_000)
    # 8 seeds: at 4 the two seed sets split on Async's verdict (its spread is the widest)
    assert len(study.sizes["full"].seeds) >= 8
    own = [a for a in study.arms_for("synthetic", "full") if "B_a=" in a.name]
    assert [(a.overrides["gba.mode"], a.overrides["gba.local_batch_size"]) for a in own] == [
        ("hop_bs", 128), ("bsp", 128), ("hop_bw", 128)]
    assert not [a for a in study.arms_for("synthetic", "quick") if "B_a=" in a.name]
    own_effects = {(c.arm, c.phase): c.effect for c in study.claims if "B_a=" in c.arm}
    assert own_effects[("bsp B_a=128", "forward")] == -0.0034
    assert own_effects[("hop_bw B_a=128", "back")] == -0.0036


@pytest.mark.slow  # ~35 s: the real algorithms at the smoke size, in a subprocess
def test_the_gba_study_at_smoke_size_hands_over_every_global_step(tmp_path):
    got = smoke_study("gba", tmp_path)
    rows = got["results"]["synthetic"]
    fw = [r for r in rows if r["phase"] == "forward"]
    assert {r["arm"] for r in fw} == {"single", "gba", "sync", "async", "hop_bs", "bsp", "hop_bw",
                                      "gba mean=buffer"}
    for r in fw:  # base 3, chunks of 2: each segment goes on from the last one's step
        assert r["step"] == 3 + 2 * r["chunk"] and r["resumed_from_step"] == r["step"] - 2
    for r in fw:
        if r["arm"] not in ("single", "hop_bw"):  # every data-list entry (M = 4) applied
            assert r["gradients_applied"] + r["dropped_gradients"] == 4 * 2
    back = [r for r in rows if r["phase"] == "back"]
    assert len(back) == 7 and all(r["resumed_from_step"] == 5 for r in back)
    text = (tmp_path / "gba_study.md").read_text()
    assert "### Claims" in text and "| gba |" in text
    assert (tmp_path / "gba_study.svg").exists() and (tmp_path / "gba_study.png").exists()


def test_records_of_other_settings_are_never_reused(tmp_path):
    """A study run again with an edited file (or another size) into the same --out: an error
    naming the segment, not the old numbers under the new settings."""
    runner.run_study(STUDY, "quick", str(tmp_path), FakeRun(), log=lambda s: None)
    import dataclasses

    edited = dataclasses.replace(STUDY, overrides={"train.batch_size": 32})
    with pytest.raises(ValueError, match="run under other settings"):
        runner.run_study(edited, "quick", str(tmp_path), FakeRun(), log=lambda s: None)


def test_a_bad_study_file_is_one_error_line(tmp_path, capsys):
    """A fuzz pass over study files (issue 40, the kit as a new surface): 15 mutations of the
    GBA study file; 8 of them ended in a traceback. Each is now one line naming the file (and
    the line of a syntax error), exit 2; a NaN effect, which passed silently, is refused."""
    src = (ROOT / "scripts" / "studies" / "gba.py").read_text()
    line = src[:src.index("MODES = (")].count("\n") + 1
    cases = {"syntax": (src.replace("MODES = (", "MODES = ((", 1),
                        f":{line}: '(' was never closed"),
             "nan": (src.replace("WITHIN = 0.001", "WITHIN = float('nan')"), "finite number"),
             "none": (src.replace("STUDY = Study(", "OTHER = Study("), "defines STUDY"),
             "ref": (src.replace('reference="single"', 'reference="x"'), "the reference 'x'")}
    for name, (text, why) in cases.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        assert study_kit.run_file(str(path), ["--smoke"], FakeRun()) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}") and why in err and "Traceback" not in err, err


def test_a_metric_no_run_reports_and_a_study_with_no_data_are_errors(tmp_path, capsys):
    bad = dataclasses.replace(STUDY, metric="eval_fooness")
    with pytest.raises(ValueError, match="'eval_fooness' is not in a run's summary"):
        runner.run_study(bad, "quick", str(tmp_path / "a"), FakeRun(), log=lambda s: None)
    gone = dataclasses.replace(STUDY, datasets={"synthetic": {"data.train": "criteo:no/such.tsv"}})
    assert study_kit.main(gone, ["--quick", "--out", str(tmp_path / "b")], FakeRun()) == 2
    assert "no dataset of the study could run" in capsys.readouterr().err


def test_a_stop_signal_as_a_segment_finishes_stops_the_study_after_its_record(tmp_path):
    """A trainer that gets SIGINT after its last step finishes its run (nothing is left to stop);
    the study must still stop at that segment boundary, keeping the finished record, and the
    same command goes on from there (before this, it was lost and the study ran on)."""
    import signal

    from recjax.train import signals

    class SignalledRun(FakeRun):
        def __call__(self, cfg):
            with signals.stop_requests() as stop:  # as `signals.graceful` wraps a trainer
                s = super().__call__(cfg)
                if len(self.calls) == 3:
                    stop.handler(signal.SIGINT, None)  # arrives after the run's last step
            return s

    cut = SignalledRun()
    with pytest.raises(KeyboardInterrupt):
        runner.run_study(STUDY, "quick", str(tmp_path), cut, log=lambda s: None)
    assert len(cut.calls) == 3
    rows = (tmp_path / "synthetic" / "segments.jsonl").read_text().splitlines()
    assert len(rows) == 3  # the third segment's record is kept
    again = FakeRun()
    runner.run_study(STUDY, "quick", str(tmp_path), again, log=lambda s: None)
    assert len(again.calls) == 3 * 14 - 3
    assert signals.requested() == 0  # nothing is left active


def test_signals_an_inner_block_received_reach_the_enclosing_one():
    import signal

    from recjax.train import signals

    with signals.stop_requests() as outer:
        with signals.stop_requests() as inner:
            inner.handler(signal.SIGTERM, None)
            assert outer.count == 0 and signals.requested() == 1
        assert outer.signals == [signal.SIGTERM] and signals.requested() == 1
    assert signals.requested() == 0


def test_a_base_arm_scratch_arms_and_a_dataset_schedule(tmp_path):
    """`Study.base` trains every seed's base (named apart from the arms), a scratch arm runs once
    from scratch at its own length while the others continue from the base, and a dataset with
    its own schedule (`Size.schedules`) runs from scratch in one whole run."""
    base = Arm("warm", {"train.algo": "single", "train.batch_size": 32})
    st = dataclasses.replace(
        STUDY, base=base,
        arms=(*STUDY.arms, Arm("s", {"train.algo": "async", "train.steps": 7}, scratch=True)),
        datasets={"synthetic": {}, "other": {}},
        sizes={"quick": Size(base=10, chunk=5, chunks=2, back_at=1, seeds=(0,),
                             schedules={"other": {"base": 0, "chunk": 0, "chunks": 1,
                                                  "back_at": 0}})})
    run = FakeRun()
    runner.run_study(st, "quick", str(tmp_path), run, datasets=["synthetic", "other"],
                     log=lambda s: None)
    w = str(tmp_path / "work" / "synthetic" / "seed0")
    want = [(f"{w}/base", "single", "gba", 10, 0, False, 32, None)]
    for name, algo, mode in (("ref", "single", "gba"), ("a", "async", "gba"), ("b", "gba", "bsp")):
        want += [(f"{w}/{name}", algo, mode, steps, 0, True, 64, steps - 5) for steps in (15, 20)]
    want.append((f"{w}/s", "async", "gba", 7, 0, False, 64, None))  # its own length, fresh
    want += [(f"{w}/{n}-back", "single", "gba", 20, 0, True, 64, 15) for n in ("a", "b")]
    o = str(tmp_path / "work" / "other" / "seed0")
    want += [(f"{o}/{n}", algo, mode, steps, 0, False, 64, None)
             for n, algo, mode, steps in (("ref", "single", "gba", 0), ("a", "async", "gba", 0),
                                          ("b", "gba", "bsp", 0), ("s", "async", "gba", 7))]
    assert run.calls == want
    rows = [json.loads(x) for x in
            (tmp_path / "synthetic" / "segments.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["phase"]) for r in rows][0] == ("warm", "base")
    with pytest.raises(ValueError, match="base run's name"):
        dataclasses.replace(st, base=Arm("a"))
    with pytest.raises(ValueError, match="only base, chunk"):
        Size(base=1, chunk=1, chunks=1, seeds=(0,), schedules={"x": {"seeds": (1,)}})
    with pytest.raises(ValueError, match="back_at"):
        Size(base=1, chunk=1, chunks=2, seeds=(0,), schedules={"x": {"base": 0, "back_at": 1}})


def test_the_progress_line_counts_every_segment_the_study_runs(tmp_path):
    """`runner.planned` is the number of segments `run_study` visits (the progress line's
    ``[k/total, ~M min left]``): on the toy study (back phases), with a scratch arm, an arm on
    fewer seeds and a dataset of its own schedule; and the GBA study file at full size, by hand
    from its arms."""
    lines = []
    res = runner.run_study(STUDY, "quick", str(tmp_path / "t"), FakeRun(), log=lines.append)
    # per seed: 3 arms x 3 chunks + 2 switched arms x 2 chunks back + the base = 14
    assert len(res["synthetic"]) == 3 * 14 and lines[-1].endswith("[42/42, ~0 min left]")
    assert lines[0].split()[-4:-2] == ["[1/42,", "~0"]  # the first segment already estimates
    st = dataclasses.replace(
        STUDY, arms=(*STUDY.arms, Arm("s", {"train.algo": "async", "train.steps": 7}, scratch=True),
                     Arm("few", {"train.algo": "async"}, seeds=2)),
        datasets={"synthetic": {}, "other": {}},
        sizes={"quick": Size(base=10, chunk=5, chunks=3, back_at=1, seeds=(0, 1, 2),
                             schedules={"other": {"base": 0, "chunk": 0, "chunks": 1,
                                                  "back_at": 0}})})
    run = FakeRun()
    lines.clear()
    out = runner.run_study(st, "quick", str(tmp_path / "s"), run, log=lines.append)
    n = sum(len(rows) for rows in out.values())
    assert n == len(run.calls) == sum(runner.planned(st, st.sizes["quick"].for_dataset(d),
                                                     st.arms_for(d, "quick"), 3) for d in out)
    assert lines[-1].startswith("  other") and f"[{n}/{n}," in lines[-1]
    # run again: every segment has its record; nothing runs, nothing is logged
    lines.clear()
    runner.run_study(st, "quick", str(tmp_path / "s"), run, log=lines.append)
    assert lines == [] and len(run.calls) == n
    gba = load(str(ROOT / "scripts" / "studies" / "gba.py"))
    full = gba.sizes["full"]
    # synthetic, per seed: the base; single, 6 modes, mean=buffer and 3 B_a=128 arms x 4
    # chunks; the 10 switched arms x 2 chunks back: 1 + 44 + 20 = 65. Frappe (no B_a arms):
    # 1 + 8 x 4 + 7 x 2 = 47
    assert runner.planned(gba, full.for_dataset("synthetic"), gba.arms_for("synthetic", "full"),
                          8) == 8 * 65
    assert runner.planned(gba, full.for_dataset("frappe"), gba.arms_for("frappe", "full"),
                          8) == 8 * 47
