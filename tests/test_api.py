"""recjax as a library: `recjax.train`, `ArraySource`, and the README's example run from elsewhere."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import recjax
from recjax.config import ConfigError
from recjax.data import arrays
from recjax.data.base import DataError
from recjax.data.pipeline import batches
from recjax.data.sources import open_source
from tests.conftest import ROOT


def _teacher(n, seed=0):
    """The example's data (examples/train_on_arrays.py), rebuilt here, and the Bayes AUC/NE."""
    rng = np.random.default_rng(seed)
    vocab = [100, 50, 20]
    dense = rng.normal(size=(n, 4)).astype(np.float32)
    ids = np.stack([rng.integers(0, v, n) for v in vocab], axis=1)
    logit = 1.5 * dense[:, 0] + np.where(ids[:, 0] % 2 == 0, 1.0, -1.0) - 0.5
    p = 1 / (1 + np.exp(-logit))
    label = (rng.random(n) < p).astype(np.float32)
    return dense, ids, label, p, vocab


def _auc_ne(y, p):
    """AUC by ranks (no ties in continuous p) and NE, in numpy: the independent reference."""
    r = np.argsort(np.argsort(p)) + 1
    pos = y.sum()
    auc = (r[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))
    ctr = y.mean()
    h = -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))
    return auc, -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)) / h


def test_array_source_yields_the_arrays_in_order_and_in_batches():
    rng = np.random.default_rng(1)
    dense = rng.normal(size=(10, 3)).astype(np.float32)
    ids = rng.integers(0, 7, (10, 2))
    label = (rng.random(10) < 0.5).astype(np.float32)
    src = recjax.ArraySource(label, dense, ids, chunk_rows=4, field_names=["user", "item"])
    assert [f.name for f in src.spec.fields] == ["user", "item"]
    assert [f.vocab_size for f in src.spec.fields] == [int(ids[:, 0].max()) + 1,
                                                        int(ids[:, 1].max()) + 1]
    got = list(batches(src, 5, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True))
    assert len(got) == 2
    np.testing.assert_array_equal(np.concatenate([b.dense for b, _ in got]), dense)
    np.testing.assert_array_equal(np.concatenate([b.ids[:, :, 0] for b, _ in got]), ids)
    np.testing.assert_array_equal(np.concatenate([b.label for b, _ in got]), label)
    assert got[0][0].mask is None and src.stats.rows == 10


def test_registered_arrays_open_as_a_data_spec_and_raw_ids_widen():
    src = recjax.ArraySource(np.array([0, 1, 1.0]), ids=np.array([[0], [2], [1]]))
    spec = arrays.register(src, "mine")
    try:
        assert spec == "arrays:mine"
        assert open_source(spec) is src
        raw = open_source(spec, raw_ids=True)
        assert next(raw.chunks()).ids.dtype == np.int64
    finally:
        arrays.unregister(spec)
    with pytest.raises(DataError, match="arrays:mine.*only in the process that made them"):
        open_source("arrays:mine")


@pytest.mark.parametrize("kwargs,msg", [
    ({"label": np.array([0, 2.0])}, r"arrays:1: field 'label': row 1: label 2.0 is not 0 or 1"),
    ({"label": np.array([0, 1.0]), "dense": np.array([[1.0], [np.nan]])},
     r"field 'dense\[0\]': row 1: value nan is not finite"),
    ({"label": np.array([0, 1.0]), "ids": np.array([[0], [5]]), "vocab_sizes": [5]},
     r"field 'C1': row 1: id \[5\] outside \[0, 5\).*Raise vocab_sizes"),
    ({"label": np.array([0, 1.0]), "ids": np.array([[-1], [0]])}, r"row 0: id \[-1\] outside"),
    ({"label": np.array([0, 1.0]), "ids": np.array([[0.5], [1]])}, "not an integer type"),
    ({"label": np.array([0, 1.0]), "dense": np.ones((3, 1))}, r"expected shape \[N=2, D\]"),
])
def test_bad_arrays_are_refused_with_row_and_field(kwargs, msg):
    with pytest.raises(DataError, match=msg):
        recjax.ArraySource(name="arrays:1", **kwargs)


def test_bad_override_is_refused_before_training():
    with pytest.raises(ConfigError, match="did you mean"):
        recjax.fit("smoke", overrides={"train.epoch": 2})


def test_train_on_arrays_learns_the_teacher_and_frees_the_registry(tmp_path):
    dense, ids, label, p, vocab = _teacher(6000, seed=3)
    train = recjax.ArraySource(label[:5000], dense[:5000], ids[:5000], vocab_sizes=vocab)
    valid = recjax.ArraySource(label[5000:], dense[5000:], ids[5000:], vocab_sizes=vocab)
    result = recjax.fit("smoke", train=train, eval=valid, overrides={
        "model.name": "lr", "train.batch_size": 128, "train.epochs": 3, "train.progress": False,
        "sparse.lr": 0.3, "dense.lr": 0.03, "train.out": str(tmp_path)})
    bayes_auc, bayes_ne = _auc_ne(label[5000:], p[5000:])
    assert result["eval_examples"] == 1000 and result["steps"] == 3 * (5000 // 128)
    assert result["dataset"].startswith("arrays:")
    assert result["eval_auc"] > bayes_auc - 0.03, (result["eval_auc"], bayes_auc)
    assert result["eval_ne"] < bayes_ne + 0.06, (result["eval_ne"], bayes_ne)
    assert (tmp_path / "summary.json").exists()
    assert not arrays._REGISTERED  # the run's sources are gone from the registry


@pytest.mark.slow
def test_readme_example_runs_from_outside_the_repo(tmp_path):
    """Issue 15 acceptance: the README's library example, run with cwd outside the checkout,
    reaches the AUC the README states (>= 0.83) near the teacher's own (0.856, numpy)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # as an installed package would resolve
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_on_arrays.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"valid AUC (\S+)\s+NE (\S+)", out.stdout)
    assert m, out.stdout
    auc, ne = float(m.group(1)), float(m.group(2))
    dense, ids, label, p, vocab = _teacher(20_000)
    bayes_auc, bayes_ne = _auc_ne(label[16_000:], p[16_000:])
    assert abs(bayes_auc - 0.856) < 1e-3
    assert 0.83 <= auc <= bayes_auc + 0.01, (auc, bayes_auc)
    assert bayes_ne - 0.01 <= ne <= 0.73, (ne, bayes_ne)
    assert not list(tmp_path.iterdir())  # no --out: the example writes nothing


def test_one_class_eval_set_warns_with_what_to_do_and_prints_unavailable(capsys, monkeypatch):
    """Issue 15: the Taobao Quickstart printed `eval_auc nan` for a 9-row one-class hold-out."""
    dense, ids, label, _, vocab = _teacher(600, seed=5)
    train = recjax.ArraySource(label[:500], dense[:500], ids[:500], vocab_sizes=vocab)
    ev = recjax.ArraySource(np.zeros(50, np.float32), dense[500:550], ids[500:550],
                            vocab_sizes=vocab)
    s = recjax.fit("smoke", train=train, eval=ev, overrides={
        "model.name": "lr", "train.batch_size": 100, "train.steps": 3, "train.progress": False})
    assert np.isnan(s["eval_auc"])
    assert any("single class" in w and "--data.holdout" in w for w in s["warnings"])
    assert "warning: eval AUC/NE are undefined" in capsys.readouterr().out

    import algorithms
    from algorithms import train_main as train_script

    monkeypatch.setattr(algorithms, "run", lambda cfg: {k: s[k] for k in ("eval_auc", "eval_logloss",
                                                                            "eval_ne", "steps")})
    assert train_script.main(["--config", "smoke", "--no-progress", "--no-compile-cache"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"eval_auc  unavailable", out) and "nan" not in out


@pytest.mark.parametrize("short_run_steps,kept", [(1000, [12]), (5, [4, 8, 12])])
def test_checkpoint_policy_short_runs_write_only_the_final_checkpoint(tmp_path, monkeypatch,
                                                                      short_run_steps, kept):
    """A 3-epoch run of 12 steps wrote a checkpoint at every epoch's end (398 MB for DeepFM on
    the Criteo sample); below SHORT_RUN_STEPS only the final one is written."""
    from recjax.train import contract

    monkeypatch.setattr(contract, "SHORT_RUN_STEPS", short_run_steps)
    dense, ids, label, _, vocab = _teacher(500, seed=6)
    src = recjax.ArraySource(label[:400], dense[:400], ids[:400], vocab_sizes=vocab)
    ev = recjax.ArraySource(label[400:], dense[400:], ids[400:], vocab_sizes=vocab)
    recjax.fit("smoke", train=src, eval=ev, overrides={
        "model.name": "lr", "train.batch_size": 100, "train.epochs": 3, "train.keep_ckpts": 5,
        "train.progress": False, "train.out": str(tmp_path)})
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == kept
