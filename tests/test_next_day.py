"""``--data.eval_protocol=next_day`` (issue 36): train day t, evaluate on day t + 1, and switch
the algorithm at day boundaries through ``--resume`` (GBA's protocol: sync days, GBA days, sync
days) on the drifting synthetic teacher.

Independent reference for every ``kind: day`` record: the run's checkpoint at that day's last
step, restored and scored by the model's predict on day t + 1's eval stream generated here
(`SyntheticSource` with ``eval_day = t + 1``), with AUC from scipy's ranks (Mann-Whitney) and
NE from the log-loss formula in numpy; the day's Bayes-optimal NE from that stream's p*.
"""

import json

import numpy as np
import pytest
from scipy.stats import rankdata

from algorithms.train_main import main
from recjax import cli
from recjax.checkpoint import Checkpointer
from recjax.data.pipeline import batches
from recjax.data.synthetic import SyntheticSource
from recjax.train.setup import build
from recjax.train.step import eval_params, jit_predict

DAYS, B = 4, 64
COMMON = ["--config", "smoke", "--model", "lr", "--batch-size", str(B), "--no-progress",
          "--synthetic.n_train=4096", "--synthetic.n_eval=1500", f"--synthetic.days={DAYS}",
          "--synthetic.drift=0.6", "--data.eval_protocol=next_day", "--train.keep_ckpts=10",
          "--gba.workers=2", "--gba.local_batch_size=32", "--deterministic"]
STEPS_PER_DAY = 4096 // DAYS // B  # 16


def _auc(y, s):
    r = rankdata(s)
    pos = y == 1
    return (r[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())


def _ne(y, p):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    ll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    c = y.mean()
    return ll / -(c * np.log(c) + (1 - c) * np.log(1 - c))


def _day_records(out):
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "day"]


@pytest.mark.slow
def test_sync_gba_sync_day_by_day(tmp_path, capsys):
    out = tmp_path / "run"
    args = [*COMMON, "--out", str(out)]
    # days 0-1 sync, day 2 GBA, day 3 sync: three commands, each resuming the last
    assert main([*args, "--algo", "single", "--steps", str(2 * STEPS_PER_DAY)]) == 0
    assert main([*args, "--algo", "gba", "--resume", "--steps", str(3 * STEPS_PER_DAY)]) == 0
    assert main([*args, "--algo", "single", "--resume"]) == 0
    printed = capsys.readouterr().out
    recs = _day_records(out)
    assert [(r["day"], r["eval_day"], r["step"], r["algorithm"]) for r in recs] == [
        (0, 1, 16, "single"), (1, 2, 32, "single"), (2, 3, 48, "gba"), (3, 4, 64, "single")]
    summary = json.loads((out / "summary.json").read_text())
    assert [d["day"] for d in summary["days"]] == [0, 1, 2, 3]
    assert "   2        3      48       gba" in printed

    cfg, _ = cli.parse([*args, "--algo", "single"], "t")
    model, _, _, like = build(cfg, SyntheticSource(cfg.synthetic).spec)
    predict = jit_predict(model)
    ck = Checkpointer(str(out / "checkpoints"), max_to_keep=10)
    try:
        for r in recs:
            state, _ = ck.restore(like, r["step"])
            syn = cfg.synthetic.__class__(**{**cfg.synthetic.__dict__,
                                             "eval_day": r["eval_day"]})
            ev = SyntheticSource(syn, "eval")
            y, logits = [], []
            for batch, n in batches(ev, 512, seed=0, epoch=0, shuffle_buffer=0,
                                    drop_remainder=False):
                logits.append(np.asarray(predict(eval_params(state), state.tables, batch))[:n])
                y.append(batch.label[:n])
            y, z = np.concatenate(y).astype(np.float64), np.concatenate(logits).astype(np.float64)
            assert y.size == 1500
            assert r["eval_auc"] == pytest.approx(_auc(y, z), abs=1e-6)
            assert r["eval_ne"] == pytest.approx(_ne(y, 1 / (1 + np.exp(-z))), rel=1e-4)
            yb, pb = ev.labels_and_bayes_probs()
            assert r["bayes_eval_ne"] == pytest.approx(_ne(yb, pb), rel=1e-6)
    finally:
        ck.close()
    # the days drift: the next day's floor differs from day to day
    assert len({round(r["bayes_eval_ne"], 6) for r in recs}) == DAYS


def test_day_boundaries_are_checked(tmp_path):
    from recjax.train.days import day_end_steps, run_days

    cfg, _ = cli.parse([*COMMON, "--out", str(tmp_path), "--steps", "20"], "t")
    assert day_end_steps(cfg) == [16, 32, 48, 64]
    with pytest.raises(ValueError, match="inside a day; the days end at steps"):
        run_days(cfg, lambda c: pytest.fail("ran"))
    odd, _ = cli.parse([*COMMON, "--synthetic.n_train=1025"], "t")
    # days of 256.25 examples: day t ends at the first step by which its rows are trained
    day = SyntheticSource(odd.synthetic).days(np.arange(1025))
    last = [int(np.flatnonzero(day == t)[-1]) for t in range(DAYS)]
    want = [min(-(-(r + 1) // B), 1025 // B) for r in last]
    assert want == [5, 9, 13, 16]
    assert day_end_steps(odd) == want
    with pytest.raises(ValueError, match="give --out"):
        run_days(odd, lambda c: pytest.fail("ran"))


def test_each_day_is_one_segment_with_its_next_day(tmp_path):
    """The segments `run_days` asks for, with a stand-in for the algorithm: steps, resume and
    eval day of each (no training)."""
    from recjax.train.days import day_records, run_days

    cfg, _ = cli.parse([*COMMON, "--out", str(tmp_path)], "t")
    seen = []

    def fake(c):
        seen.append((c.train.steps, c.train.resume, c.synthetic.eval_day, c.data.eval_protocol))
        return {"steps": c.train.steps, "algorithm": c.train.algo, "eval_auc": 0.5 + c.train.steps,
                "eval_ne": 1.0, "eval_logloss": 0.6}

    got = run_days(cfg, fake)
    assert seen == [(16, False, 1, "final"), (32, True, 2, "final"), (48, True, 3, "final"),
                    (64, True, 4, "final")]
    assert [d["eval_auc"] for d in got["days"]] == [16.5, 32.5, 48.5, 64.5]
    assert [d["day"] for d in day_records(str(tmp_path))] == [0, 1, 2, 3]
