"""The teacher with a behaviour sequence and ``seq:KIND:PATH`` (recjax/data/synthetic_seq.py):
the stream against a per-example loop over the module docstring's definition, the Bayes-optimal
probabilities, the position layout of a real multi-hot file, and DIN from the CLI on both."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.train_main import main
from recjax.batch import Chunk
from recjax.data.sources import open_source
from recjax.data.synthetic_seq import SeqTeacherConfig, SeqTeacherSource
from recjax.data.taobao import TaobaoSource
from recjax.features import FeatureSpec, FieldSpec
from recjax.models.sequence import sequences, unroll_chunk, unroll_spec
from tests.conftest import data_path

L = 6


def _source(**kw) -> SeqTeacherSource:
    return SeqTeacherSource(SeqTeacherConfig(**{"n": 3000, "max_len": L, "n_items": 60,
                                                "n_categories": 7, **kw}))


def test_stream_follows_the_definition_example_by_example():
    src = _source()
    (chunk, p), = list(src._stream())
    names = [f.name for f in src.spec.fields]
    assert names == ["context", "item", "cate", *(f"hist@{j}" for j in range(L)),
                     *(f"hist_cate@{j}" for j in range(L))]
    c = src.cfg
    ids, mask = chunk.ids[:, :, 0], chunk.mask[:, :, 0]
    for i in range(chunk.size):
        x, t, ct = ids[i, :3]
        n = int(mask[i, 3:3 + L].sum())
        assert 1 <= n <= L and mask[i, :3].all()
        assert mask[i, 3:3 + L].tolist() == [1] * n + [0] * (L - n)  # a prefix, then padding
        assert mask[i, 3 + L:].tolist() == mask[i, 3:3 + L].tolist()
        hist = ids[i, 3:3 + n]
        assert ct == src.category[t]
        assert ids[i, 3 + L:3 + L + n].tolist() == [src.category[b] for b in hist]
        assert not ids[i, 3 + n:3 + L].any() and not ids[i, 3 + L + n:].any()
        m = sum(1 for b in hist if src.category[b] == src.category[t])
        z = c.bias + src.w_item[t] + src.w_context[x] + c.alpha * m
        assert p[i] == pytest.approx(1 / (1 + np.exp(-z)), rel=1e-12)
    lengths = mask[:, 3:3 + L].sum(1)
    assert set(lengths.astype(int)) == set(range(1, L + 1))  # every length occurs
    assert abs(chunk.label.mean() - p.mean()) < 0.03


def test_related_targets_share_a_category_with_a_behaviour():
    for p_related, low, high in ((1.0, 1.0, 1.0), (0.0, 0.0, 0.9)):
        src = _source(p_related=p_related)
        chunk = next(src.chunks())
        ids, mask = chunk.ids[:, :, 0], chunk.mask[:, :, 0]
        match = ((ids[:, 3 + L:] == ids[:, 2:3]) & (mask[:, 3 + L:] > 0)).any(1).mean()
        assert low <= match <= high, (p_related, match)


def test_streams_are_deterministic_and_the_splits_differ():
    a, b = next(_source().chunks()), next(_source().chunks())
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.label, b.label)
    ev = _source(split="eval")
    assert not np.array_equal(next(ev.chunks()).ids, a.ids)
    np.testing.assert_array_equal(ev.w_item, _source().w_item)  # one teacher
    bayes = ev.bayes_optimal()
    assert 0 < bayes["ne"] < 1 and 0.5 < bayes["auc"] < 1


def test_the_spec_string_and_its_errors():
    src = open_source("synthetic-seq:n=100,max_len=4,alpha=0.5,split=eval")
    assert src.cfg == SeqTeacherConfig(n=100, max_len=4, alpha=0.5, split="eval")
    assert [(s.name, src.spec.fields[s.target].name) for s in sequences(src.spec)] == [
        ("hist", "item"), ("hist_cate", "cate")]
    with pytest.raises(ValueError, match="bad option 'lenght=3'.*key one of n, split"):
        open_source("synthetic-seq:lenght=3")
    with pytest.raises(ValueError, match="alpha='x' is not a float"):
        open_source("synthetic-seq:alpha=x")
    with pytest.raises(ValueError, match="split must be train or eval"):
        open_source("synthetic-seq:split=test")


def test_seq_reads_a_multi_hot_file_as_position_fields():
    path = data_path("taobao_ad_tiny", "train_sample.csv")
    plain = TaobaoSource(path, multi_hot_len=4, hash_buckets=512)
    seq = open_source(f"seq:taobao:{path}", multi_hot_len=4, hash_buckets=512)
    a, b = next(plain.chunks()), next(seq.chunks())
    f = [x.name for x in seq.spec.fields]
    assert f[-4:] == [f"click_sequence@{j}" for j in range(4)] and len(f) == plain.spec.n_fields + 3
    assert b.ids.shape == (a.size, len(f), 1) and b.mask.shape == b.ids.shape
    np.testing.assert_array_equal(b.ids[:, -4:, 0], a.ids[:, -1, :])
    np.testing.assert_array_equal(b.mask[:, -4:, 0], a.mask[:, -1, :])
    np.testing.assert_array_equal(b.ids[:, :-4, 0], a.ids[:, :-1, 0])
    assert {seq.spec.fields[i].table for i in range(len(f) - 4, len(f))} == {"adgroup_id"}
    (s,) = sequences(seq.spec)
    assert seq.spec.fields[s.target].name == "adgroup_id"
    assert seq.stats is plain.stats or seq.stats.rows == a.size


def test_din_trains_on_taobao_from_the_cli(tmp_path):
    """Issue 39 step 3: ``--model din`` on the Taobao sample's click sequence, end to end."""
    train = data_path("taobao_ad_tiny", "train_sample.csv")
    valid = data_path("taobao_ad_tiny", "valid_sample.csv")
    assert main(["--config", "smoke", "--model", "din", "--data", f"seq:taobao:{train}",
                 "--eval-data", f"seq:taobao:{valid}", "--data.multi_hot_len=8",
                 "--data.hash_buckets=4096", "--batch-size", "16", "--epochs", "2", "--seed", "1",
                 "--out", str(tmp_path), "--no-progress"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["model"] == "din" and s["steps"] == 12 and s["eval_examples"] == 100
    assert np.isfinite(s["train_ne"]) and np.isfinite(s["eval_ne"])


def test_din_without_a_sequence_says_how_to_give_it_one(tmp_path, capsys):
    path = data_path("taobao_ad_tiny", "train_sample.csv")
    assert main(["--config", "smoke", "--model", "din", "--data", f"taobao:{path}", "--steps",
                 "1", "--batch-size", "16", "--out", str(tmp_path), "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "din: the data has no behaviour sequence" in err and "--data seq:KIND:PATH" in err


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(1, 4), min_size=1, max_size=5), n=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_unroll_moves_every_id_and_mask_to_its_position_field(lens, n, seed):
    """Any mix of one-hot and multi-hot fields: field f's position p is the unrolled field named
    f@p (f itself when one-hot), with its id and mask, by a loop over the names."""
    spec = FeatureSpec((), tuple(FieldSpec(f"f{i}", 9, max_len=m) for i, m in enumerate(lens)))
    rng = np.random.default_rng(seed)
    big = spec.max_len
    ids = rng.integers(0, 9, (n, len(lens), big)).astype(np.int32)
    mask = (rng.random((n, len(lens), big)) < 0.6).astype(np.float32)
    chunk = Chunk(np.zeros((n, 0), np.float32), ids, mask, np.zeros(n, np.float32), np.arange(n))
    out, flat = unroll_chunk(chunk, spec), unroll_spec(spec)
    names = [f.name for f in flat.fields]
    if not spec.multi_hot:
        assert out is chunk
        return
    assert out.ids.shape == out.mask.shape == (n, sum(lens), 1)
    for i, f in enumerate(spec.fields):
        for p in range(f.max_len):
            j = names.index(f.name if f.max_len == 1 else f"{f.name}@{p}")
            np.testing.assert_array_equal(out.ids[:, j, 0], ids[:, i, p])
            np.testing.assert_array_equal(out.mask[:, j, 0], mask[:, i, p])
            assert flat.fields[j].table == f.table
