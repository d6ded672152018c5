"""Selection, sharding, shuffling, batching, hold-out split and caching of example streams."""

import numpy as np
import pytest

from recjax.batch import Chunk
from recjax.data.base import ReadStats
from recjax.data.criteo import CriteoSource
from recjax.data.pipeline import CachedSource, batches, cached, holdout_split
from recjax.data.taobao import TaobaoSource
from recjax.features import FeatureSpec, FieldSpec
from tests.conftest import data_path


class ArraySource:
    """`n` examples whose content encodes their row: ids[:, 0, 0] == row, so order is visible."""

    def __init__(self, n: int, chunk_rows: int = 7, skip_every: int = 0):
        self.name, self.n, self.chunk_rows, self.skip_every = "array", n, chunk_rows, skip_every
        self.spec = FeatureSpec(("a", "b"), (FieldSpec("row", 10**6), FieldSpec("mod", 10)))
        self.stats = ReadStats()
        self.passes = 0

    def chunks(self):
        self.passes += 1
        self.stats = ReadStats()
        for start in range(0, self.n, self.chunk_rows):
            rows = np.arange(start, min(start + self.chunk_rows, self.n))
            if self.skip_every:  # rows with gaps, as after skipped bad lines
                rows = rows[rows % self.skip_every != 1]
            self.stats.rows += len(rows)
            yield Chunk(dense=np.stack([rows, -rows], 1).astype(np.float32),
                        ids=np.stack([rows, rows % 10], 1)[:, :, None].astype(np.int32),
                        mask=None, label=(rows % 3 == 0).astype(np.float32), row=rows)


def rows_of(stream) -> np.ndarray:
    """Rows of the real examples of a stream of (batch, n_valid), checking shapes on the way."""
    out = []
    for batch, n in stream:
        assert batch.ids.shape[0] == batch.dense.shape[0] == batch.label.shape[0]
        assert (batch.ids[n:] == 0).all() and (batch.label[n:] == 0).all()  # padding
        np.testing.assert_array_equal(batch.dense[:n, 0], batch.ids[:n, 0, 0])  # rows intact
        np.testing.assert_array_equal(batch.label[:n], batch.ids[:n, 0, 0] % 3 == 0)
        out.append(batch.ids[:n, 0, 0])
    return np.concatenate(out) if out else np.zeros(0, np.int32)


def run(src, batch_size=8, *, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=False, **kw):
    return batches(src, batch_size, seed=seed, epoch=epoch, shuffle_buffer=shuffle_buffer,
                   drop_remainder=drop_remainder, **kw)


def test_file_order_and_padding():
    out = list(run(ArraySource(30), batch_size=8))
    assert [n for _, n in out] == [8, 8, 8, 6]
    assert all(b.size == 8 for b, _ in out)
    np.testing.assert_array_equal(rows_of(out), np.arange(30))


def test_drop_remainder():
    out = list(run(ArraySource(30), batch_size=8, drop_remainder=True))
    assert [n for _, n in out] == [8, 8, 8]
    np.testing.assert_array_equal(rows_of(out), np.arange(24))
    assert list(run(ArraySource(5), batch_size=8, drop_remainder=True)) == []


def test_batch_larger_than_chunks_and_chunks_larger_than_batch():
    for chunk_rows, batch_size in [(3, 10), (50, 4), (10, 10)]:
        got = rows_of(run(ArraySource(47, chunk_rows), batch_size))
        np.testing.assert_array_equal(got, np.arange(47))


@pytest.mark.parametrize("buffer", [1, 5, 16, 47, 48, 1000])
def test_shuffle_is_a_permutation(buffer):
    got = rows_of(run(ArraySource(47), shuffle_buffer=buffer, seed=3))
    assert sorted(got.tolist()) == list(range(47))
    # a buffer of S examples can only move an example forward by S positions
    assert (got <= np.arange(47) + buffer).all()


def test_shuffle_deterministic_per_seed_and_epoch():
    def order(seed, epoch):
        return rows_of(run(ArraySource(100), shuffle_buffer=20, seed=seed, epoch=epoch)).tolist()
    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)
    assert order(1, 0) != list(range(100))


def test_big_buffer_is_a_full_permutation():
    got = rows_of(run(ArraySource(200), shuffle_buffer=10**9, seed=0))
    assert sorted(got.tolist()) == list(range(200))
    assert got[:20].max() > 100  # late examples come out early: not a local shuffle


@pytest.mark.parametrize("num_workers", [1, 2, 3, 5])
def test_workers_partition_the_stream(num_workers):
    src = ArraySource(53, skip_every=4)  # rows with gaps
    every = rows_of(run(src))
    parts = [rows_of(run(src, shuffle_buffer=9, worker=w, num_workers=num_workers, seed=w))
             for w in range(num_workers)]
    union = np.concatenate(parts)
    assert len(union) == len(every) and set(union.tolist()) == set(every.tolist())
    for w, part in enumerate(parts):
        assert (part % num_workers == w).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="worker"):
        run(ArraySource(5), worker=2, num_workers=2)
    with pytest.raises(ValueError, match="batch_size"):
        run(ArraySource(5), batch_size=0)
    with pytest.raises(ValueError, match="fraction"):
        holdout_split(0, 1.5)


def test_holdout_split_disjoint_complete_stable():
    keep_train, keep_eval = holdout_split(seed=7, fraction=0.2)
    rows = np.arange(100_000)
    tr, ev = keep_train(rows), keep_eval(rows)
    assert not (tr & ev).any() and (tr | ev).all()
    assert abs(ev.mean() - 0.2) < 0.01
    np.testing.assert_array_equal(ev, holdout_split(7, 0.2)[1](rows))  # same on every call
    assert (ev != holdout_split(8, 0.2)[1](rows)).any()  # the seed matters
    # membership of a row does not depend on which other rows are asked about (per chunk)
    np.testing.assert_array_equal(np.concatenate([keep_eval(rows[:500]), keep_eval(rows[500:])]),
                                  ev)
    assert keep_eval(rows[:10]).tolist() == keep_eval(rows[:10]).tolist()


def test_holdout_with_shuffle_and_workers():
    src = ArraySource(300)
    keep_train, keep_eval = holdout_split(seed=1, fraction=0.3)
    train = np.concatenate([rows_of(run(src, shuffle_buffer=50, worker=w, num_workers=2,
                                        keep=keep_train)) for w in range(2)])
    ev = rows_of(run(src, keep=keep_eval))
    assert sorted(np.concatenate([train, ev]).tolist()) == list(range(300))
    assert not set(train.tolist()) & set(ev.tolist())


def test_cached_parses_once_and_is_read_only():
    inner = ArraySource(40)
    src = cached(inner, max_rows=100)
    first = rows_of(run(src, shuffle_buffer=10, epoch=0))
    assert src.is_cached and inner.passes == 1
    again = rows_of(run(src, shuffle_buffer=10, epoch=0))
    np.testing.assert_array_equal(first, again)
    assert inner.passes == 1 and src.stats.rows == 40
    batch, _ = next(run(src, batch_size=7))
    with pytest.raises(ValueError, match="read-only"):
        batch.ids[0] = 1


def test_cached_early_stop_and_too_big():
    inner = ArraySource(40)
    src = CachedSource(inner, max_rows=100)
    next(run(src))  # abandoned pass: nothing cached
    assert not src.is_cached
    big = cached(ArraySource(40), max_rows=39)
    for _ in range(2):
        assert len(rows_of(run(big))) == 40
    assert not big.is_cached and big.source.passes == 2


def test_criteo_epoch_of_batches():
    src = cached(CriteoSource(data_path("criteo_kaggle_8k", "train.tsv"), chunk_rows=1000))
    out = list(run(src, batch_size=512, shuffle_buffer=2048, seed=0))
    assert sum(n for _, n in out) == 7200 and len(out) == 15
    b, n = out[-1]
    assert n == 7200 - 14 * 512 and b.dense.shape == (512, 13) and b.ids.shape == (512, 26, 1)
    assert b.mask is None and b.label.dtype == np.float32


def test_multi_hot_mask_padded():
    src = TaobaoSource(data_path("taobao_ad_tiny", "train_sample.csv"), multi_hot_len=5)
    out = list(run(src, batch_size=64, shuffle_buffer=32))
    (b0, n0), (b1, n1) = out
    assert (n0, n1) == (64, 36) and b1.mask.shape == (64, src.spec.n_fields, 5)
    assert (b1.mask[n1:] == 0).all() and (b1.mask[:n1, :-1, 0] == 1).all()
