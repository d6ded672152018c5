"""Readers on the real samples (skipped when absent), hashing, and `open_source`."""

import os
import subprocess
import sys

import numpy as np
import pytest

from recjax.batch import concat_chunks
from recjax.data.avazu import AvazuSource
from recjax.data.base import DataError
from recjax.data.criteo import CriteoCSVSource, CriteoSource
from recjax.data.hashing import hash_tokens, mix64, uniform01
from recjax.data.libfm import FRAPPE_VOCAB, FrappeSource
from recjax.data.movielens import MovieLensSource
from recjax.data.sources import SOURCES, open_source
from recjax.data.taobao import TaobaoSource
from tests.conftest import ROOT, data_path

TOKENS = [b"", b"68fd1e64", b"80e26c9b", b"a"]


# ----------------------------------------------------------------------------- hashing


def test_hash_golden_values():
    # Pinned: a change here re-maps every categorical id, so old checkpoints stop matching.
    assert hash_tokens(TOKENS, 0, 1 << 17).tolist() == [118191, 92844, 50279, 111854]
    assert hash_tokens(TOKENS, 25, 1000).tolist() == [498, 361, 784, 136]
    # splitmix64 of state 0 is the published first output 0xE220A8397B1DCDAF.
    assert mix64(np.array([0, 1, 2**63], np.uint64)).tolist() == [
        0xE220A8397B1DCDAF, 10451216379200822465, 5196802822362493915]
    np.testing.assert_array_equal(uniform01(0, np.arange(3)),
                                  [0.6524484863740322, 0.03401170130434639, 0.8429655109060831])


def test_hash_same_in_another_process():
    code = ("from recjax.data.hashing import hash_tokens;"
            f"print(hash_tokens({TOKENS!r}, 3, 12345).tolist())")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == str(hash_tokens(TOKENS, 3, 12345).tolist())


def test_hash_range_and_salt():
    tokens = [b"%08x" % i for i in range(20000)]
    a, b = hash_tokens(tokens, 0, 1000), hash_tokens(tokens, 1, 1000)
    assert a.dtype == np.int32 and a.min() >= 0 and a.max() < 1000
    assert np.mean(a == b) < 0.01  # the salt gives each field its own bucket map
    assert np.bincount(a, minlength=1000).min() > 0  # spreads over every bucket
    with pytest.raises(ValueError):
        hash_tokens(tokens, 0, 0)


# ----------------------------------------------------------------------------- real samples


def read_all(source):
    chunks = list(source.chunks())
    assert all(c.size <= source.chunk_rows for c in chunks)
    return concat_chunks(chunks)


def check_chunk(source, chunk, rows, pos_rate):
    spec = source.spec
    assert chunk.size == rows == source.stats.rows
    np.testing.assert_array_equal(chunk.row, np.arange(rows))
    assert set(np.unique(chunk.label)) <= {0.0, 1.0}
    assert abs(chunk.label.mean() - pos_rate) < 0.01
    assert chunk.dense.shape == (rows, spec.n_dense) and chunk.dense.dtype == np.float32
    assert np.isfinite(chunk.dense).all()
    assert chunk.ids.shape == (rows, spec.n_fields, spec.max_len) and chunk.ids.dtype == np.int32
    vocab = np.array([f.vocab_size for f in spec.fields])[None, :, None]
    assert (chunk.ids >= 0).all() and (chunk.ids < vocab).all()
    assert (chunk.mask is None) == (not spec.multi_hot)


@pytest.mark.parametrize("file,rows,rate", [("train.tsv", 7200, 0.2151),
                                            ("valid.tsv", 409, 0.2274)])
def test_criteo(file, rows, rate):
    src = CriteoSource(data_path("criteo_kaggle_8k", file), chunk_rows=1000)
    c = read_all(src)
    check_chunk(src, c, rows, rate)
    assert src.spec.n_dense == 13 and src.spec.n_fields == 26
    assert (c.dense >= 0).all()  # log1p(max(x, 0))
    assert len({len(np.unique(c.ids[:, k])) for k in range(26)}) > 5  # fields differ


def test_criteo_csv_matches_tsv():
    csv = CriteoCSVSource(data_path("criteo_kaggle_csv", "train.tiny.csv"))
    c = read_all(csv)
    check_chunk(csv, c, 1999, 0.2091)
    # Both files start with line 1 of Criteo's train.txt: the two layouts must agree on it.
    t = next(CriteoSource(data_path("criteo_kaggle_8k", "train.tsv")).chunks())
    np.testing.assert_array_equal(c.ids[0], t.ids[0])
    np.testing.assert_array_equal(c.dense[0], t.dense[0])
    np.testing.assert_allclose(c.dense[0, :3], np.log1p([1, 1, 5]), rtol=1e-6)


@pytest.mark.parametrize("file,rows,rate,header", [("train.csv", 8087, 0.1727, True),
                                                    ("valid.csv", 480, 0.1792, False)])
def test_avazu(file, rows, rate, header):
    src = AvazuSource(data_path("avazu_9k", file))
    c = read_all(src)
    assert src.has_header == header
    check_chunk(src, c, rows, rate)
    assert src.spec.n_dense == 0 and src.spec.n_fields == 23
    # hour 14102100 = Tuesday 2014-10-21, 00h.
    assert (c.ids[:, 0, 0] == 0).all() and (c.ids[:, 1, 0] == 1).all()


def test_frappe_shares_one_table():
    src = FrappeSource(data_path("frappe", "frappe.train.libfm"), chunk_rows=10000)
    c = read_all(src)
    check_chunk(src, c, 57722, 19063 / 57722)
    assert {f.table for f in src.spec.fields} == {"frappe"}
    assert c.ids.max() < FRAPPE_VOCAB
    # field ranges documented in the data's PROVENANCE.md (user 0-956, ..., city 5149-5381)
    assert c.ids[:, 0].max() <= 956 and c.ids[:, 9].min() >= 5149
    np.testing.assert_array_equal(c.ids[0, :, 0], [266, 1244, 5042, 5049, 5054, 5055, 5058,
                                                   5062, 5074, 5149])


def test_movielens():
    src = MovieLensSource(data_path("movielens_100k", "u.data"))
    c = read_all(src)
    check_chunk(src, c, 100_000, 0.55375)
    assert c.label.sum() == 34174 + 21201  # ratings 4 and 5
    assert [f.vocab_size for f in src.spec.fields] == [944, 1683, 24, 7]
    assert len(np.unique(c.ids[:, 0])) == 943 and len(np.unique(c.ids[:, 1])) == 1682


@pytest.mark.parametrize("file", ["train_sample.csv", "valid_sample.csv", "test_sample.csv"])
def test_taobao(file):
    src = TaobaoSource(data_path("taobao_ad_tiny", file), multi_hot_len=4)
    c = read_all(src)
    check_chunk(src, c, 100, 0.04)
    seq = src.spec.fields[-1]
    assert seq.name == "click_sequence" and seq.max_len == 4 and seq.table == "adgroup_id"
    m = c.mask
    assert m.shape == c.ids.shape
    assert (m[:, :-1, 0] == 1).all() and (m[:, :-1, 1:] == 0).all()  # one-hot: position 0 only
    assert (c.ids[m == 0] == 0).all()  # padding holds id 0
    lengths = m[:, -1].sum(1)
    assert (np.diff(m[:, -1], axis=1) <= 0).all()  # real ids first, then padding
    assert (lengths == 0).any() and (lengths > 0).any()  # empty sequences -> all padding


def test_taobao_truncation_counted():
    src = TaobaoSource(data_path("taobao_ad_tiny", "train_sample.csv"), multi_hot_len=2)
    c = read_all(src)
    assert c.mask[:, -1].sum(1).max() == 2
    # train_sample.csv: sequence lengths 0 x75, 1 x15, 2 x8, 3 x1, 6 x1
    assert src.stats.truncated["click_sequence"] == 2
    assert src.stats.as_dict()["truncated_by_field"] == {"click_sequence": 2}


def test_taobao_sequence_shares_adgroup_rows(tmp_path):
    header = ("clk,time_stamp,userid,adgroup_id,pid,cate_id,campaign_id,customer,brand,price,"
              "cms_segid,cms_group_id,final_gender_code,age_level,pvalue_level,shopping_level,"
              "occupation,new_user_class_level,click_sequence\n")
    line = "1,2017-05-08 13:00:00,7,555,p,1,2,3,4,,0,3,2,3,,3,0,,9^555\n"
    p = tmp_path / "t.csv"
    p.write_text(header + line)
    src = TaobaoSource(p)
    c = read_all(src)
    adgroup = [f.name for f in src.spec.fields].index("adgroup_id")
    assert c.ids[0, -1, 1] == c.ids[0, adgroup, 0]  # same token, same table -> same row
    assert c.ids[0, -1, 0] != c.ids[0, adgroup, 0]
    assert c.ids[0, 0, 0] == 13 and c.ids[0, 1, 0] == 0  # 13h on a Monday
    assert c.dense[0, 0] == 0.0  # missing price


def test_chunking_does_not_change_data():
    path = data_path("criteo_kaggle_8k", "valid.tsv")
    a = read_all(CriteoSource(path))
    b = read_all(CriteoSource(path, chunk_rows=7))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


# ----------------------------------------------------------------------------- open_source


def test_open_source_kinds(monkeypatch):
    path = data_path("movielens_100k", "u.data")
    src = open_source(f"movielens:{path}")
    assert isinstance(src, MovieLensSource) and src.name == f"movielens:{path}"
    src = open_source(f"criteo:{data_path('criteo_kaggle_8k', 'valid.tsv')}", hash_buckets=100)
    assert {f.vocab_size for f in src.spec.fields} == {100}
    assert {"criteo", "criteo-csv", "avazu", "frappe", "movielens", "taobao"} <= set(SOURCES)


def test_open_source_unknown_kind():
    with pytest.raises(ValueError, match=r"unknown data kind 'tfrecord'.*known kinds: .*criteo"):
        open_source("tfrecord:x.tfrecord")


def test_open_source_registry_hook(monkeypatch):
    seen = {}

    def factory(arg, name, options):
        seen.update(arg=arg, name=name, buckets=options.hash_buckets)
        return "a source"

    monkeypatch.setitem(SOURCES, "fake", factory)
    assert open_source("fake", hash_buckets=7) == "a source"
    assert seen == {"arg": "", "name": "fake", "buckets": 7}


def test_open_source_missing_file_and_recjax_data(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RECJAX_DATA", raising=False)
    with pytest.raises(DataError, match="no such file.*RECJAX_DATA"):
        open_source("criteo:nowhere/train.tsv")
    data = tmp_path / "data"
    (data / "mine").mkdir(parents=True)
    (data / "mine" / "u.data").write_text("1\t2\t4\t881250949\n")
    monkeypatch.setenv("RECJAX_DATA", str(data))
    src = open_source("movielens:mine/u.data")
    assert src.path == str(data / "mine" / "u.data")
    assert read_all(src).label.tolist() == [1.0]
