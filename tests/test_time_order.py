"""Days of a Parquet dataset and its time order (``--data.order=time``, ``data.eval_day``;
recjax/data/days.py), and row groups decoded on several threads.

References written here: each file's rows read with pyarrow (file i is day i); the windows of a
day cut from its first example every W examples, each permuted by
``default_rng([seed, 9, w])``, the definition in the module docstring, with w counted over the
days' windows in order; the hold-out predicate applied to pyarrow's rows.
"""

import numpy as np
import pyarrow.parquet as pq
import pytest

from recjax import cli
from recjax.data.columnar import ParquetSource
from recjax.data.convert import convert
from recjax.data.days import TimeWindows, day_starts, days_of
from recjax.data.pipeline import batches, holdout_split
from recjax.tools.bench_data import synthetic_sample
from recjax.train.data import open_data, train_shuffle_buffer
from tests.conftest import assert_same_arrays, data_path

SIZES = (700, 1100, 500)  # examples of days 0, 1, 2


@pytest.fixture(scope="module")
def days_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("days")
    specs = []
    for i, n in enumerate(SIZES):
        p = d / f"day_{i}.tsv"
        p.write_bytes(synthetic_sample(n, seed=i))
        specs.append(f"criteo:{p}")
    convert(specs, str(d / "pq"), rows_per_group=256)
    return str(d / "pq")


def _file_rows(path):
    return [pq.read_table(f"{path}/part-{i:05d}.parquet", columns=["row"])["row"].to_numpy()
            for i in range(len(SIZES))]


def _all(chunks):
    return [c for c in chunks]


def test_days_are_the_files(days_dir):
    src = ParquetSource(days_dir)
    rows = _file_rows(days_dir)
    for i, r in enumerate(rows):
        assert np.all(days_of(src, r) == i)
    np.testing.assert_array_equal(day_starts(src), np.cumsum([0, *SIZES]))


def test_threads_decode_the_same_chunks(days_dir):
    one = _all(ParquetSource(days_dir, chunk_rows=300).chunks())
    many = ParquetSource(days_dir, chunk_rows=300, workers=3)
    got = _all(many.chunks())
    assert len(got) == len(one)
    for a, b in zip(got, one):
        assert_same_arrays(a, b)
    assert many.rows_read == sum(SIZES)
    for a, b in zip(_all(many.chunks(start=777)), _all(ParquetSource(days_dir, chunk_rows=300)
                                                          .chunks(start=777))):
        assert_same_arrays(a, b)


@pytest.mark.parametrize("window", [7, 64, 300, 5000])
def test_time_windows(days_dir, window):
    src = ParquetSource(days_dir)
    tw = TimeWindows(src, window, seed=3)
    stream = np.concatenate([c.row for c in tw.chunks()])
    rows = np.concatenate(_file_rows(days_dir))  # the stream in file order
    want, w = [], 0
    for a, b in zip(np.cumsum([0, *SIZES[:-1]]), np.cumsum(SIZES)):
        for lo in range(a, b, window):
            hi = min(lo + window, b)
            want.append(rows[lo + np.random.default_rng([3, 9, w]).permutation(hi - lo)])
            w += 1
    np.testing.assert_array_equal(stream, np.concatenate(want))
    assert np.all(np.diff(days_of(src, stream)) >= 0)  # days in order
    # seeking: batches from batch k equal the stream's from k; row ids agree with the chunks
    full = [b for b, _ in batches(tw, 128, seed=0, epoch=0, shuffle_buffer=0,
                                  drop_remainder=True)]
    for k in (0, 5, 13):
        got = [b for b, _ in batches(TimeWindows(ParquetSource(days_dir), window, seed=3), 128,
                                     seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True,
                                     start=k)]
        assert len(got) == len(full) - k
        for a, b in zip(got, full[k:]):
            assert_same_arrays(a, b)
    ids = np.concatenate([tw.chunk_row_ids(c) for c in range(len(tw.chunk_sizes()))])
    np.testing.assert_array_equal(ids, stream)
    other = np.concatenate([c.row for c in TimeWindows(src, window, seed=4).chunks()])
    assert not np.array_equal(other, stream)


def _cfg(days_dir, *extra):
    cfg, _ = cli.parse(["--data", f"parquet:{days_dir}", "--no-progress", "--batch-size", "64",
                        *extra], "t")
    return cfg


def test_order_time_and_eval_day(days_dir):
    rows = _file_rows(days_dir)
    keep_train, keep_eval = holdout_split(0, 0.1)
    data = open_data(_cfg(days_dir, "--data.order=time", "--data.shuffle_buffer=128",
                          "--data.eval_day=1"))
    assert isinstance(data.train, TimeWindows) and train_shuffle_buffer(data, 128) == 0
    assert data.train_rows == sum(int(keep_train(r).sum()) for r in rows)
    want_eval = rows[1][keep_eval(rows[1])]
    got_eval = np.concatenate([c.row[np.asarray(data.keep_eval(c.row), bool)]
                               for c in data.eval.chunks()])
    np.testing.assert_array_equal(got_eval, want_eval)
    assert data.eval_rows == want_eval.size and "day 1 of the seeded hold-out" in data.eval_desc
    # file order (no windows) with a buffer of 0; the eval set as usual without eval_day
    plain = open_data(_cfg(days_dir, "--data.order=time", "--data.shuffle_buffer=0"))
    assert isinstance(plain.train, type(data.eval))
    assert plain.eval_rows == sum(int(keep_eval(r).sum()) for r in rows)


def test_order_time_needs_days(tmp_path):
    p = tmp_path / "a.tsv"
    p.write_bytes(synthetic_sample(300))
    cfg, _ = cli.parse(["--data", f"criteo:{p}", "--data.order=time", "--no-progress"], "t")
    with pytest.raises(ValueError, match="need data with days"):
        open_data(cfg)
    smoke, _ = cli.parse(["--config", "smoke", "--data.eval_day=1"], "t")
    with pytest.raises(ValueError, match="use --synthetic.eval_day"):
        open_data(smoke)


@pytest.mark.slow  # three runs: ~15 s
def test_next_day_on_parquet_days(days_dir, tmp_path):
    """A day-by-day run on a Parquet dataset of three day files: each day ends at the first
    step by which its training rows (the rows outside the hold-out) are trained, and is
    evaluated on the next day's hold-out rows; the last day on the whole hold-out."""
    import json

    from algorithms.train_main import main

    out = tmp_path / "run"
    assert main(["--config", "smoke", "--model", "lr", "--data", f"parquet:{days_dir}",
                 "--data.hash_buckets=1024", "--batch-size", "64", "--no-progress",
                 "--data.order=time", "--data.shuffle_buffer=100",
                 "--data.eval_protocol=next_day", "--out", str(out)]) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    days = [r for r in recs if r["kind"] == "day"]
    keep_train, keep_eval = holdout_split(0, 0.1)
    rows = _file_rows(days_dir)
    trained = np.cumsum([int(keep_train(r).sum()) for r in rows])
    held = [int(keep_eval(r).sum()) for r in rows]
    assert [r["step"] for r in days] == [min(-(-int(t) // 64), int(trained[-1]) // 64)
                                         for t in trained]
    assert [r["eval_day"] for r in days] == [1, 2, None]
    assert [r["eval_examples"] for r in days] == [held[1], held[2], sum(held)]


def _avazu_days(tmp_path, n=3000):
    """The Avazu sample's first n rows, their hour rewritten in time order: three days
    (2014-10-21, 22, 23), each a day of 24 hours; returns the path and each row's day, hour."""
    src = data_path("avazu_9k", "train.csv").read_text().splitlines()
    head, rows = src[0], src[1:n + 1]
    day = np.arange(n) * 3 // n
    hour = (np.arange(n) % (n // 3)) * 24 // (n // 3)
    out = [head]
    for r, d, h in zip(rows, day, hour):
        cols = r.split(",")
        cols[2] = f"1410{21 + d:02d}{h:02d}"
        out.append(",".join(cols))
    p = tmp_path / "avazu_days.csv"
    p.write_text("\n".join(out) + "\n")
    return p, day, hour


def test_split_on_a_field_makes_day_and_hour_files(tmp_path):
    path, day, hour = _avazu_days(tmp_path)
    whole = convert([f"avazu:{path}"], str(tmp_path / "whole"), rows_per_group=256)
    by_day = convert([f"avazu:{path}"], str(tmp_path / "days"), rows_per_group=256,
                     split_on="weekday")
    by_hour = convert([f"avazu:{path}"], str(tmp_path / "hours"), rows_per_group=256,
                      split_on="hour_of_day")
    assert len(whole["files"]) == 1 and len(by_day["files"]) == 3
    assert len(by_hour["files"]) == 72
    src = ParquetSource(str(tmp_path / "days"))
    for i in range(3):  # file i holds exactly day i's rows (the data rows are lines 1..n)
        rows = pq.read_table(str(tmp_path / "days" / f"part-{i:05d}.parquet"),
                             columns=["row"])["row"].to_numpy()
        np.testing.assert_array_equal(rows, np.flatnonzero(day == i))
        assert np.all(days_of(src, rows) == i)
    hsrc = ParquetSource(str(tmp_path / "hours"))
    all_rows = np.concatenate([c.row for c in hsrc.chunks()])
    np.testing.assert_array_equal(days_of(hsrc, all_rows), day * 24 + hour)
    # the same examples and the same stream as one file: only the files differ
    one = _all(ParquetSource(str(tmp_path / "whole"), chunk_rows=500).chunks())
    for other in ("days", "hours"):
        got = _all(ParquetSource(str(tmp_path / other), chunk_rows=500).chunks())
        assert len(got) == len(one)
        for a, b in zip(got, one):
            assert_same_arrays(a, b)
    assert by_day["files"][-1]["read_stats"]["rows"] == 3000
    assert by_day["files"][0]["read_stats"] is None and by_day["files"][0]["first_row"] == 0
    with pytest.raises(ValueError, match="--split-on C1: not a field of exact ids.*weekday"):
        convert([f"avazu:{path}"], str(tmp_path / "bad"), split_on="C1")
