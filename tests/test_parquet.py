"""Converted datasets (recjax/data/convert.py, columnar.py): ``parquet:DIR`` gives the chunks of
the text reader it was converted from, for every shared sample, with hashed ids (two bucket
counts) and raw ids; bad text is named as the text reader names it; a damaged dataset is named
with what is wrong; a run trains from it.

Random files (tokens of every form, bad lines, multi-hot lengths): tests/test_parquet_props.py.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from recjax.data.base import DataError
from recjax.data.columnar import ParquetSource
from recjax.data.convert import convert
from recjax.data.pipeline import batches, holdout_split
from recjax.data.sources import open_source
from recjax.registry import NAMES
from tests.conftest import ROOT, assert_same_arrays, data_path

SAMPLES = [("criteo", "criteo_kaggle_8k/train.tsv"), ("criteo", "criteo_kaggle_8k/valid.tsv"),
           ("criteo-csv", "criteo_kaggle_csv/train.tiny.csv"), ("avazu", "avazu_9k/train.csv"),
           ("avazu", "avazu_9k/valid.csv"), ("frappe", "frappe/frappe.train.libfm"),
           ("movielens", "movielens_100k/u.data"), ("taobao", "taobao_ad_tiny/train_sample.csv")]
OPTIONS = [{"hash_buckets": 1 << 17}, {"hash_buckets": 1000, "multi_hot_len": 3},
           {"raw_ids": True}, {"raw_ids": True, "multi_hot_len": 2}]


def assert_same_chunks(text, columnar) -> None:
    """Same spec, same chunks (every array: dtype, shape, values), same counters (rows, and
    when no line was skipped, truncated sequences and raw ids of no exact form)."""
    assert columnar.spec == text.spec
    got, want = list(columnar.chunks()), list(text.chunks())
    assert [c.size for c in got] == [c.size for c in want]
    for g, w in zip(got, want):
        assert_same_arrays(g, w)
    assert columnar.stats.rows == text.stats.rows
    if not text.stats.skipped:  # the text readers count bad lines' ids too, before dropping them
        assert columnar.stats.truncated == text.stats.truncated
        assert getattr(columnar, "raw_hashed", {}) == getattr(text, "raw_hashed", {})


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each sample converted once (small row groups, so a pass crosses row groups)."""
    out = {}

    def get(kind, rel):
        if (kind, rel) not in out:
            path = data_path(*rel.split("/"))
            d = tmp_path_factory.mktemp("pq") / "data"
            convert([f"{kind}:{path}"], str(d), rows_per_group=3000)
            out[kind, rel] = (str(path), str(d))
        return out[kind, rel]

    return get


@pytest.mark.parametrize("kind,rel", SAMPLES, ids=[f"{k}:{r}" for k, r in SAMPLES])
@pytest.mark.parametrize("options", OPTIONS, ids=["hashed", "hashed-1000-L3", "raw", "raw-L2"])
def test_every_sample_round_trips(converted, kind, rel, options):
    path, d = converted(kind, rel)
    assert_same_chunks(open_source(f"{kind}:{path}", chunk_rows=2500, **options),
                       open_source(f"parquet:{d}", chunk_rows=2500, **options))


def test_batches_shuffled_and_split_are_the_text_readers(converted):
    """The pipeline's batches (shuffle buffer, hold-out split, a padded last batch) from
    Parquet equal those from the text: the chunk boundaries match, so the shuffle does too."""
    path, d = converted("criteo", "criteo_kaggle_8k/train.tsv")
    keep_train, _ = holdout_split(7, 0.1)
    kw = dict(seed=3, epoch=1, shuffle_buffer=5000, drop_remainder=False, keep=keep_train)
    text = list(batches(open_source(f"criteo:{path}", chunk_rows=1024), 512, **kw))
    col = list(batches(open_source(f"parquet:{d}", chunk_rows=1024), 512, **kw))
    assert len(col) == len(text) > 10
    for (a, na), (b, nb) in zip(col, text):
        assert na == nb
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_manifest_records_the_conversion(converted):
    path, d = converted("criteo", "criteo_kaggle_8k/train.tsv")
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    assert m["rows"] == 7200 and m["files"][0]["row_groups"] == [3000, 3000, 1200]
    assert m["files"][0]["input"] == f"criteo:{path}" and m["files"][0]["lines"] == 7200
    f = pq.ParquetFile(os.path.join(d, "part-00000.parquet"))
    assert json.loads(f.metadata.metadata[b"recjax.columnar"])["layout"] == m["layout"]
    assert f.schema_arrow.field("crc:C1").type == "uint32"
    assert f.schema_arrow.field("raw:C1").type == "int64"
    src = ParquetSource(d)
    assert [(g.file, g.index, g.rows) for g in src.groups] == [(0, 0, 3000), (0, 1, 3000),
                                                                (0, 2, 1200)]
    assert src.read_group(src.groups[1]).row[0] == 3000 and src.num_rows == 7200


def test_a_run_reads_only_the_columns_it_needs(converted, monkeypatch):
    _, d = converted("criteo", "criteo_kaggle_8k/valid.tsv")
    seen = []
    real = pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kw):
        seen.append(tuple(columns))
        return real(self, i, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    for raw in (False, True):
        list(open_source(f"parquet:{d}", raw_ids=raw).chunks())
    assert {c.split(":")[0] for c in seen[0]} == {"row", "label", "dense", "crc"}
    assert {c.split(":")[0] for c in seen[-1]} == {"row", "label", "dense", "raw"}


# ----------------------------------------------------------------------------- several inputs


def test_several_inputs_continue_the_rows(converted, tmp_path):
    """Two inputs become two files; rows count on from the first input's lines (bad lines
    included), so row-keyed splits see one dataset."""
    train = data_path("criteo_kaggle_8k", "train.tsv")
    valid = data_path("criteo_kaggle_8k", "valid.tsv")
    lines = train.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"".join(lines[:100] + [b"oops\n"] + lines[100:300]))
    d = tmp_path / "both"
    m = convert([f"criteo:{bad}", f"criteo:{valid}"], str(d), rows_per_group=128,
                skip_bad_lines=True)
    assert [f["name"] for f in m["files"]] == ["part-00000.parquet", "part-00001.parquet"]
    assert [f["first_row"] for f in m["files"]] == [0, 301]
    assert m["files"][0]["read_stats"]["skipped_lines"] == 1
    assert "bad.tsv:101" in m["files"][0]["read_stats"]["first_skipped"][0]
    chunks = list(open_source(f"parquet:{d}").chunks())
    rows = np.concatenate([c.row for c in chunks])
    want = np.concatenate([np.arange(100), np.arange(101, 301), 301 + np.arange(409)])
    np.testing.assert_array_equal(rows, want)
    text = [c for s in (f"criteo:{bad}", f"criteo:{valid}")
            for c in open_source(s, skip_bad_lines=True).chunks()]
    np.testing.assert_array_equal(np.concatenate([c.ids for c in chunks]),
                                  np.concatenate([c.ids for c in text]))


def test_inputs_of_two_schemas_are_refused(tmp_path):
    criteo = data_path("criteo_kaggle_8k", "valid.tsv")
    avazu = data_path("avazu_9k", "valid.csv")
    with pytest.raises(DataError, match="has another schema than criteo:"):
        convert([f"criteo:{criteo}", f"avazu:{avazu}"], str(tmp_path / "x"))
    assert not os.listdir(tmp_path)  # nothing left behind, not even the partial folder


def test_a_source_pickles_and_only_text_converts(converted, tmp_path):
    """A source crosses to another process without its open files (it reopens them); the
    converter reads text kinds only."""
    import pickle

    _, d = converted("criteo", "criteo_kaggle_8k/valid.tsv")
    src = open_source(f"parquet:{d}")
    list(src.chunks())
    assert_same_chunks(src, pickle.loads(pickle.dumps(src)))
    with pytest.raises(ValueError, match="the converter reads text"):
        convert([f"parquet:{d}"], str(tmp_path / "again"))


# ----------------------------------------------------------------------------- bad text


def test_a_bad_line_is_named_as_the_text_reader_names_it(tmp_path):
    lines = data_path("criteo_kaggle_8k", "valid.tsv").read_bytes().splitlines(keepends=True)
    f = tmp_path / "x.tsv"
    f.write_bytes(b"".join(lines[:250] + [lines[250].replace(b"\t", b"\tz", 3)] + lines[251:]))
    with pytest.raises(DataError) as text:
        list(open_source(f"criteo:{f}").chunks())
    with pytest.raises(DataError) as conv:
        convert([f"criteo:{f}"], str(tmp_path / "out"))
    assert str(conv.value) == str(text.value)
    assert f"{f}:251: field 'I1': not an integer: got 'z0'" in str(conv.value)
    assert sorted(os.listdir(tmp_path)) == ["x.tsv"]  # no partial output


def test_a_file_of_bad_lines_is_refused(tmp_path):
    f = tmp_path / "x.tsv"
    f.write_bytes(b"a\tb\nc\td\n")
    with pytest.raises(DataError, match="every line was skipped"):
        convert([f"criteo:{f}"], str(tmp_path / "out"), skip_bad_lines=True)


def test_out_must_be_new_or_empty(tmp_path):
    f = data_path("criteo_kaggle_8k", "valid.tsv")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(ValueError, match="not an empty folder"):
        convert([f"criteo:{f}"], str(tmp_path / "full"))
    (tmp_path / "empty").mkdir()
    convert([f"criteo:{f}"], str(tmp_path / "empty"))
    assert sorted(os.listdir(tmp_path / "empty")) == ["manifest.json", "part-00000.parquet"]


# ----------------------------------------------------------------------------- multi-hot length


def test_multi_hot_len_beyond_the_conversion(tmp_path):
    """Up to the converter's --multi-hot-len any length reads as the text does; beyond it only
    when no example was cut (then the lists are whole)."""
    f = data_path("taobao_ad_tiny", "train_sample.csv")  # sequences of up to 6 ids
    for keep, ok in ((4, False), (6, True)):
        d = tmp_path / f"L{keep}"
        m = convert([f"taobao:{f}"], str(d), multi_hot_len=keep)
        assert (m["truncated"]["click_sequence"] > 0) == (not ok)
        assert_same_chunks(open_source(f"taobao:{f}", multi_hot_len=keep),
                           open_source(f"parquet:{d}", multi_hot_len=keep))
        if ok:
            assert_same_chunks(open_source(f"taobao:{f}", multi_hot_len=9),
                               open_source(f"parquet:{d}", multi_hot_len=9))
        else:
            with pytest.raises(DataError, match="convert again with a larger --multi-hot-len"):
                open_source(f"parquet:{d}", multi_hot_len=5)
    with pytest.raises(ValueError, match="multi_hot_len must be >= 2 for click_sequence"):
        open_source(f"parquet:{tmp_path / 'L6'}", multi_hot_len=1)


# ----------------------------------------------------------------------------- damage


@pytest.fixture
def small(tmp_path, converted):
    """A private copy of a converted sample, to damage."""
    _, d = converted("criteo", "criteo_kaggle_8k/valid.tsv")
    out = tmp_path / "copy"
    shutil.copytree(d, out)
    return out


def _read_all(d, **kw):
    return [c for c in open_source(f"parquet:{d}", **kw).chunks()]


def test_a_flipped_byte_names_the_file_row_group_and_column(tmp_path):
    f = data_path("criteo_kaggle_8k", "valid.tsv")
    d = tmp_path / "d"
    convert([f"criteo:{f}"], str(d), rows_per_group=100)
    part = d / "part-00000.parquet"
    meta = pq.ParquetFile(part).metadata
    col = meta.row_group(2).column(meta.schema.to_arrow_schema().names.index("crc:C17"))
    data = bytearray(part.read_bytes())
    data[col.data_page_offset + col.total_compressed_size // 2] ^= 0x40
    part.write_bytes(bytes(data))
    _read_all(d, raw_ids=True)  # the damage is in a column raw ids never read
    with pytest.raises(DataError) as e:
        _read_all(d)
    assert str(e.value).startswith(f"{part}: row group 2 cannot be read, column [crc:C17] "
                                   "damaged (")
    assert "checksum" in str(e.value) and "Convert the text again" in str(e.value)


@pytest.mark.parametrize("damage,words", [
    (lambda d: (d / "part-00000.parquet").write_bytes((d / "part-00000.parquet").read_bytes()[:-9]),
     "bytes, manifest.json records"),
    (lambda d: (d / "part-00000.parquet").unlink(), "listed in manifest.json but missing"),
    (lambda d: (d / "manifest.json").unlink(), "no manifest.json"),
    (lambda d: (d / "manifest.json").write_text("{"), "manifest.json: cannot be read"),
    (lambda d: (d / "manifest.json").write_text(
        (d / "manifest.json").read_text().replace('"rows": 409', '"rows": 410')), "malformed"),
    (lambda d: (d / "manifest.json").write_text(
        (d / "manifest.json").read_text().replace('"version": 1', '"version": 7')),
     "format version 7"),
])
def test_a_damaged_dataset_is_named(small, damage, words):
    damage(small)
    with pytest.raises(DataError, match=words):
        _read_all(small)


def test_a_file_of_another_conversion_is_named(small, tmp_path):
    """Same size by construction is unlikely, so the check that fires is the size or, with the
    manifest's size edited to match, the row groups or the layout."""
    other = tmp_path / "other"
    convert([f"criteo:{data_path('criteo_kaggle_8k', 'valid.tsv')}"], str(other),
            rows_per_group=200)
    shutil.copy(other / "part-00000.parquet", small / "part-00000.parquet")
    m = json.loads((small / "manifest.json").read_text())
    m["files"][0]["bytes"] = (small / "part-00000.parquet").stat().st_size
    (small / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"has row groups of \[200, 200, 9\] rows, manifest.json "
                                        r"records \[409\]"):
        _read_all(small)


def test_a_file_is_not_a_dataset(tmp_path):
    f = data_path("criteo_kaggle_8k", "valid.tsv")
    with pytest.raises(DataError, match="not a converted dataset's folder"):
        open_source(f"parquet:{f}")
    with pytest.raises(DataError, match="no such file"):
        open_source(f"parquet:{tmp_path / 'nothing'}")


# ----------------------------------------------------------------------------- the scripts


@pytest.mark.slow
def test_convert_then_train_from_the_cli(tmp_path):
    """scripts/convert.py, then scripts/train.py --data parquet:DIR as a user runs them."""
    f = data_path("criteo_kaggle_8k", "train.tsv")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "scripts/convert.py", f"criteo:{f}", "--out",
                          str(tmp_path / "pq")], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout
    assert "7,200 rows" in out and f"--data parquet:{tmp_path / 'pq'}" in out
    subprocess.run([sys.executable, "scripts/train.py", "--config", "smoke", "--model", "deepfm",
                    "--data", f"parquet:{tmp_path / 'pq'}", "--steps", "5", "--batch-size", "256",
                    "--data.hash_buckets=1024", "--out", str(tmp_path / "run"), "--no-progress"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["steps"] == 5 and s["eval_auc"] is not None
    assert s["dataset"].startswith("parquet:")


def test_train_reads_parquet(tmp_path, converted):
    """In process (fast): the run driver opens parquet:DIR like any spec and trains."""
    from algorithms.train_main import main

    _, d = converted("avazu", "avazu_9k/train.csv")
    assert main(["--config", "smoke", "--model", "fm", "--data", f"parquet:{d}", "--steps", "3",
                 "--batch-size", "256", "--data.hash_buckets=1024", "--out",
                 str(tmp_path / "run"), "--no-progress"]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["steps"] == 3 and "hold-out" in s["eval_dataset"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", NAMES)
def test_every_algorithm_trains_from_parquet(tmp_path, converted, algo):
    from algorithms.train_main import main

    _, d = converted("avazu", "avazu_9k/train.csv")
    assert main(["--config", "smoke", "--model", "fm", "--algo", algo, "--data", f"parquet:{d}",
                 "--steps", "4", "--batch-size", "256", "--data.hash_buckets=1024", "--out",
                 str(tmp_path / "run"), "--no-progress"]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["steps"] == 4 and s["dataset"] == f"parquet:{d}"


def test_convert_script_reports_a_bad_line(tmp_path):
    f = tmp_path / "x.tsv"
    f.write_bytes(b"1\t2\n")
    r = subprocess.run([sys.executable, "scripts/convert.py", f"criteo:{f}", "--out",
                        str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and f"error: {f}:1: field 'I2': field count" in r.stderr
