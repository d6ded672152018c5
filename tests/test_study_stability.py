"""Two runs of a study with different seed sets: which verdicts agree (recjax/study/stability.py,
``compare.py NAME --agree-with OTHER``), on hand-made verdicts and through the kit's main with
the stand-in run of tests/test_study_kit.py."""

import json

import pytest

import recjax.study as study_kit
from recjax.study import stability
from tests.test_study_kit import STUDY, FakeRun


def _v(claim, verdict, phase="forward"):
    return {"claim": claim, "verdict": verdict, "phase": phase}


def test_agreement_by_hand():
    a = {"syn": [_v("c1", "held"), _v("c2", "held"), _v("c3", "unresolved"), _v("c4", "held"),
                 _v("c1", "did not hold", "back")],
         "frappe": [_v("c1", "held")]}
    b = {"syn": [_v("c1", "held"), _v("c2", "did not hold"), _v("c3", "held"),
                 _v("c5", "held"), _v("c1", "did not hold", "back")]}
    got = {(r["dataset"], r["claim"], r["phase"]): r["status"]
           for r in stability.agreement(a, b)}
    assert got == {("syn", "c1", "forward"): "agree", ("syn", "c2", "forward"): "disagree",
                   ("syn", "c3", "forward"): "open", ("syn", "c4", "forward"): "missing",
                   ("syn", "c1", "back"): "agree", ("frappe", "c1", "forward"): "missing",
                   ("syn", "c5", "forward"): "missing"}
    assert stability.summary(stability.agreement(a, b)) == {
        "agree": 2, "disagree": 1, "open": 1, "missing": 3}
    text = stability.markdown(stability.agreement(a, b), "A", "B")
    assert "2 verdicts agree, **1 disagree**, 1 open" in text
    assert "| syn | c2 | held | did not hold | disagree |" in text
    assert "| syn | c1 (back) |" not in text  # agreeing rows are counted, not listed


def test_two_seed_sets_through_the_kit(tmp_path, capsys):
    """The stand-in's metric is the algorithm's bonus + steps + seed / 1000, so a - ref is
    -0.02 on any seed set: the second run agrees on both claims, and says so in its files."""
    first, second = tmp_path / "a", tmp_path / "b"
    assert study_kit.main(STUDY, ["--quick", "--out", str(first)], FakeRun()) == 0
    assert study_kit.main(STUDY, ["--quick", "--seeds", "3,4,5", "--out", str(second),
                                  "--agree-with", str(first)], FakeRun()) == 0
    got = json.loads((second / "toy_study.json").read_text())["agreement"]
    assert got["with"] == str(first)
    assert [c["status"] for c in got["claims"]] == ["agree", "agree"]
    assert "2 verdicts agree, **0 disagree**" in (second / "toy_study.md").read_text()


def test_a_bad_agree_with_is_an_error_before_any_run(tmp_path, capsys):
    run = FakeRun()
    assert study_kit.main(STUDY, ["--quick", "--out", str(tmp_path / "x"), "--agree-with",
                                  str(tmp_path / "nothing")], run) == 2
    assert run.calls == [] and "error: --agree-with" in capsys.readouterr().err
    (tmp_path / "toy_study.json").write_text("{}")
    assert study_kit.main(STUDY, ["--quick", "--agree-with", str(tmp_path)], run) == 2
    assert "not a study's JSON" in capsys.readouterr().err


@pytest.mark.parametrize("a,b,status", [("held", "held", "agree"),
                                        ("held", "unresolved", "open"),
                                        ("unresolved", "unresolved", "open"),
                                        ("did not hold", "held", "disagree")])
def test_one_claim(a, b, status):
    (r,) = stability.agreement({"d": [_v("c", a)]}, {"d": [_v("c", b)]})
    assert r["status"] == status
