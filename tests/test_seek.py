"""Seeking an epoch's batch stream (recjax/data/seek.py, ``batches(..., start=k)``).

Reference: the uninterrupted stream, read from its start, with its first k batches dropped
(what `train_batches` did before it seeked). Every seekable source (in-memory arrays, a cached
text sample, a converted Parquet dataset, the synthetic generator) gives exactly those batches
for file order, a buffer smaller than the data, one as large, worker shares and a hold-out
split, at batch boundaries inside and across chunks and row groups. Reading is counted: a
seek reads no example of batches ``< k`` (a logging source records every position read).
"""

import itertools

import numpy as np
import pytest

from recjax.batch import Chunk
from recjax.data.arrays import ArraySource
from recjax.data.convert import convert
from recjax.data.pipeline import batches, cached, holdout_split
from recjax.data.seek import epoch_rows, locate, seekable
from recjax.data.sources import open_source
from recjax.data.synthetic import SyntheticSource, preset
from tests.conftest import assert_same_arrays, data_path

B = 16


def arrays(n=403, chunk_rows=37, seed=0) -> ArraySource:
    rng = np.random.default_rng(seed)
    return ArraySource(label=rng.integers(0, 2, n), dense=rng.random((n, 3)),
                       ids=rng.integers(0, 50, (n, 2)), chunk_rows=chunk_rows)


def assert_batches_equal(got, want) -> None:
    assert len(got) == len(want)
    for (g, gn), (w, wn) in zip(got, want):
        assert gn == wn
        assert_same_arrays(g, w)


def check_seeks(source, starts, **kw) -> None:
    """batches(start=k) == batches()[k:] for every k in `starts`, on a seekable source."""
    assert seekable(source)
    want = list(batches(source, B, seed=3, epoch=1, drop_remainder=True, **kw))
    for k in starts:
        got = list(batches(source, B, seed=3, epoch=1, drop_remainder=True, start=k, **kw))
        assert_batches_equal(got, want[k:])


SETTINGS = [dict(shuffle_buffer=0), dict(shuffle_buffer=50), dict(shuffle_buffer=7),
            dict(shuffle_buffer=1000),  # >= the data: one permutation at the end
            dict(shuffle_buffer=50, worker=1, num_workers=3),
            dict(shuffle_buffer=0, worker=2, num_workers=3),
            dict(shuffle_buffer=40, keep=holdout_split(5, 0.3)[0]),
            dict(shuffle_buffer=0, keep=holdout_split(5, 0.3)[1], worker=0, num_workers=2)]


@pytest.mark.parametrize("kw", SETTINGS)
def test_arrays_seek_as_replay(kw):
    check_seeks(arrays(), [1, 2, 3, 5, 8, 11, 15, 19, 24], **kw)


@pytest.mark.parametrize("kw", SETTINGS[:4] + SETTINGS[6:7])
def test_cached_seek_as_replay(kw):
    source = cached(arrays(chunk_rows=64))
    for _ in source.chunks():  # the pass that fills the cache
        pass
    assert source.is_cached
    check_seeks(source, [1, 4, 7, 13, 22], **kw)


def test_past_the_end_is_empty_as_replay():
    source = arrays()
    for kw in SETTINGS[:4]:
        n = len(list(batches(source, B, seed=0, epoch=0, drop_remainder=True, **kw)))
        assert list(batches(source, B, seed=0, epoch=0, drop_remainder=True, start=n, **kw)) == []
        assert list(batches(source, B, seed=0, epoch=0, drop_remainder=True, start=n + 3,
                            **kw)) == []


class Logged(ArraySource):
    """An ArraySource that records the stream positions of every example it hands out."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.read: list[np.ndarray] = []

    def chunks(self, start=0):
        for chunk in super().chunks(start):
            self.read.append(chunk.row.copy())
            yield chunk

    def take_rows(self, positions):
        self.read.append(np.asarray(positions).copy())
        return super().take_rows(positions)


@pytest.mark.parametrize("kw", SETTINGS[:3] + SETTINGS[6:7])
def test_seek_reads_no_example_of_earlier_batches(kw):
    """Which examples went into batches < k: the rows of those batches' positions, found by
    tagging every example with its position in its label-independent dense column."""
    n = 403
    src = arrays(n)
    tagged = Logged(label=src.label, dense=np.arange(n, dtype=np.float32)[:, None],
                    ids=src.ids, chunk_rows=37)
    want = list(batches(tagged, B, seed=3, epoch=1, drop_remainder=True, **kw))
    for k in (3, 9, 17):
        used = np.concatenate([b.dense[:, 0] for b, _ in want[:k]]).astype(np.int64)
        tagged.read, before = [], tagged.rows_read
        got = list(batches(tagged, B, seed=3, epoch=1, drop_remainder=True, start=k, **kw))
        assert_batches_equal(got, want[k:])
        read = np.concatenate(tagged.read or [np.zeros(0, np.int64)])
        assert not np.intersect1d(read, used).size  # nothing of batches < k
        assert tagged.rows_read - before == read.size
        # everything read is a distinct example: nothing twice (buffer, pending, rest)
        assert np.unique(read).size == read.size
        assert read.size + used.size <= n


def test_locate_reads_nothing_and_counts_rows():
    src = Logged(label=np.zeros(100), dense=np.zeros((100, 1)), chunk_rows=9)
    keep = holdout_split(1, 0.25)[0]
    pos = locate(src, 4, seed=0, epoch=0, shuffle_buffer=10, batch=5, keep=keep)
    assert src.read == [] and src.rows_read == 0
    assert pos.summary()["batch"] == 5 and pos.buffer.size == 10
    assert epoch_rows(src, keep=keep) == int(np.count_nonzero(keep(np.arange(100))))
    assert epoch_rows(src, worker=1, num_workers=3) == 33


@pytest.fixture(scope="module")
def criteo_parquet(tmp_path_factory):
    out = tmp_path_factory.mktemp("pq") / "criteo"
    convert([f"criteo:{data_path('criteo_kaggle_8k/train.tsv')}"], str(out), rows_per_group=700)
    return str(out)


@pytest.mark.parametrize("kw", [SETTINGS[0], SETTINGS[1], SETTINGS[4], SETTINGS[6],
                                dict(shuffle_buffer=3000)])
def test_parquet_seek_as_replay(criteo_parquet, kw):
    source = open_source(f"parquet:{criteo_parquet}", chunk_rows=1000)
    check_seeks(source, [1, 40, 62, 63, 200, 431], **kw)


def test_parquet_seek_decodes_no_earlier_row_group(criteo_parquet):
    """File order: a seek to batch k decodes only the row group the cursor is in and later
    ones; the uninterrupted pass decodes every row."""
    source = open_source(f"parquet:{criteo_parquet}", chunk_rows=1000)
    full = source.rows_read
    n = len(list(batches(source, B, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True)))
    assert source.rows_read - full == source.num_rows
    for k in (100, 300):
        before = source.rows_read
        got = list(batches(source, B, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True,
                           start=k))
        assert len(got) == n - k
        # k * B rows are behind the cursor; the cursor's group (<= 700 rows) is read whole
        assert source.rows_read - before <= source.num_rows - k * B + 700
        assert source.rows_read - before < source.num_rows - k * B + 1000


def test_parquet_row_ids_match_chunks(criteo_parquet):
    source = open_source(f"parquet:{criteo_parquet}", chunk_rows=1000)
    for c, chunk in enumerate(source.chunks()):
        np.testing.assert_array_equal(source.chunk_row_ids(c), chunk.row)
    assert [c.size for c in source.chunks()] == source.chunk_sizes()


def test_synthetic_seek_as_replay():
    source = SyntheticSource(preset("smoke"))
    source.CHUNK = 300  # several chunks
    source.num_rows = 1000
    check_seeks(source, [1, 18, 19, 40], shuffle_buffer=0)
    check_seeks(source, [1, 18, 40], shuffle_buffer=100)


def test_take_rows_in_any_order():
    src = arrays(100, chunk_rows=7)
    pos = np.array([99, 3, 50, 3, 0, 64])
    got = src.take_rows(pos)
    c = cached(arrays(100, chunk_rows=7))
    list(c.chunks())
    for g in (got, c.take_rows(pos)):
        assert isinstance(g, Chunk)
        np.testing.assert_array_equal(g.row, pos)
        np.testing.assert_array_equal(g.dense, src.dense[pos])
    with pytest.raises(IndexError):
        src_c = c.take_rows(np.array([100]))
        del src_c


def test_text_source_not_cached_replays():
    """A text source (no seek) is read from its start and the first k batches dropped."""
    spec = f"criteo:{data_path('criteo_kaggle_8k/train.tsv')}"
    source = open_source(spec)
    assert not seekable(source)
    want = list(itertools.islice(batches(source, 64, seed=0, epoch=0, shuffle_buffer=100,
                                         drop_remainder=True), 5, 9))
    got = list(itertools.islice(batches(source, 64, seed=0, epoch=0, shuffle_buffer=100,
                                        drop_remainder=True, start=5), 4))
    assert_batches_equal(got, want)


@pytest.mark.parametrize("make", ["arrays", "cached"])
def test_a_workers_share_reads_its_own_examples(make):
    """In memory, worker w of W reads the examples with row % W == w and no other (the count
    of a `Counted` view and the source's own); a hold-out split reads its side only."""
    from recjax.data.seek import Counted

    n = 403
    src = arrays(n)
    if make == "cached":
        src = cached(src)
        list(src.chunks())
    keep = holdout_split(2, 0.3)[0]
    for w in range(3):
        view, before = Counted(src), src.rows_read
        list(batches(view, B, seed=0, epoch=0, shuffle_buffer=50, drop_remainder=True,
                     worker=w, num_workers=3))
        assert view.rows == len(range(w, n, 3)) == src.rows_read - before
    view = Counted(src)
    list(batches(view, B, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True, keep=keep))
    assert view.rows == int(np.count_nonzero(keep(np.arange(n))))


@pytest.mark.parametrize("make", ["arrays", "cached"])
def test_block_batches_hold_this_process_rows_of_the_global_batches(make):
    """A process's block (rows [lo, hi) of every global batch) equals those rows of the
    batches one process makes, the other rows are zero, and only the block is read."""
    from recjax.train.data import block_batches

    src = arrays(403, chunk_rows=64)
    if make == "cached":
        src = cached(src)
        list(src.chunks())
    keep = holdout_split(2, 0.2)[0]
    order = dict(seed=4, epoch=2, shuffle_buffer=100, keep=keep)
    want = list(batches(src, 32, drop_remainder=True, **order))
    for rows, start in ((slice(0, 16), 0), (slice(16, 32), 0), (slice(8, 24), 3)):
        before = src.rows_read
        got = list(block_batches(src, 32, rows, start=start, **order))
        assert len(got) == len(want) - start
        for g, (w, _) in zip(got, want[start:]):
            for a, b in zip(g, w):
                if b is None:
                    continue
                np.testing.assert_array_equal(a[rows], b[rows])
                assert not a[:rows.start].any() and not a[rows.stop:].any()
        assert src.rows_read - before == len(got) * 16


@pytest.mark.parametrize("kw", SETTINGS[:4] + SETTINGS[6:7])
def test_first_batches_read_only_their_examples(kw):
    from recjax.data.pipeline import first_batches

    kw = {k: v for k, v in kw.items() if k not in ("worker", "num_workers")}
    src = arrays()
    want = list(itertools.islice(batches(src, B, seed=1, epoch=0, drop_remainder=True, **kw), 5))
    before = src.rows_read
    got = first_batches(src, B, 5, seed=1, epoch=0, **kw)
    assert_batches_equal([(b, B) for b in got], want)
    assert src.rows_read - before == 5 * B


def test_open_data_fills_the_cache_only_when_it_fits(criteo_parquet):
    """A Parquet dataset that fits --data.cache_rows is read once at open into memory (the
    host-async workers then share it); a larger one is counted from its manifest, unread."""
    from recjax import cli
    from recjax.train.data import open_data

    for cache_rows, cached_after, read in ((100_000, True, 7200), (0, False, 0)):
        cfg, _ = cli.parse(["--data", f"parquet:{criteo_parquet}", "--data.holdout=0.1",
                            f"--data.cache_rows={cache_rows}"], "t")
        data = open_data(cfg)
        assert data.train.is_cached == cached_after
        assert data.train.source.rows_read == read
        assert data.train_rows == int(np.count_nonzero(data.keep_train(np.arange(7200))))


def test_rows_read_counts_every_read_of_threads_at_once(monkeypatch):
    """The workers' supplies of one run read a shared source by position from several threads:
    ``rows_read`` (summary.json's ``data_rows_read``) counts every example. The bare ``+=``
    lost counts whenever a thread switch fell between its read and its write (the synthetic
    source computes a chunk's size in between): forced here by switching threads every
    microsecond, each take of a chunk the source does not keep (each thread its own two
    chunks: another's kept chunk never spares it a count)."""
    import sys
    import threading

    import recjax.data.seek as seek_mod

    src = SyntheticSource(preset("smoke"))
    takes, threads = 3000, 4
    n_chunks = 2 * threads
    monkeypatch.setattr(src, "CHUNK", 64)
    monkeypatch.setattr(src, "num_rows", 64 * n_chunks, raising=False)
    monkeypatch.setattr(src, "_generate", lambda c, n: (None, None))  # counting, not making
    monkeypatch.setattr(seek_mod, "gather", lambda sizes, read, pos: read(int(pos[0]) // 64))

    def go(k):
        for i in range(takes):
            src._last = (None,)  # no chunk kept: every take counts its chunk
            src.take_rows(np.array([(2 * k + i % 2) * 64]))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=go, args=(k,)) for k in range(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    finally:
        sys.setswitchinterval(old)
    assert src.rows_read == threads * takes * 64
