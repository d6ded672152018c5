"""A process's block of every global batch read from a Parquet dataset on disk with a shuffle
(`recjax.train.data.block_batches`): the same rows as one process's batches, and each row group
decoded about twice per epoch, not once per batch that holds one of its rows (a batch's rows lie
all over the shuffle buffer's window: read batch by batch, process 0 of 2 decoded 19x the rows
it delivered with a buffer of 4 row groups, 76x with 16; tests/test_seek.py covers sources held
in memory, which are read by position)."""

import numpy as np
import pytest

from recjax.data.columnar import ParquetSource
from recjax.data.convert import convert
from recjax.data.pipeline import batches, holdout_split
from recjax.tools.bench_data import synthetic_sample
from recjax.train.data import block_batches

N, GROUP, B = 6000, 256, 128


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("blocks")
    (d / "a.tsv").write_bytes(synthetic_sample(N, seed=2))
    convert([f"criteo:{d / 'a.tsv'}"], str(d / "pq"), rows_per_group=GROUP)
    return str(d / "pq")


@pytest.mark.parametrize("buffer", [0, 1024, 4096])
def test_blocks_equal_the_batches_and_decode_each_group_about_twice(dataset, buffer):
    order = dict(seed=1, epoch=0, shuffle_buffer=buffer, keep=holdout_split(0, 0.1)[0])
    want = [b for b, _ in batches(ParquetSource(dataset), B, drop_remainder=True, **order)]
    for rows, start in ((slice(0, 64), 0), (slice(64, 128), 5)):
        src = ParquetSource(dataset)
        got = list(block_batches(src, B, rows, start=start, **order))
        assert len(got) == len(want) - start
        for g, w in zip(got, want[start:]):
            for a, b in zip(g, w):
                if b is not None:
                    np.testing.assert_array_equal(a[rows], b[rows])
                    assert not a[:rows.start].any() and not a[rows.stop:].any()
        # each lookahead of ceil(buffer / B) batches spans at most its own rows and the
        # buffer's: about two passes' worth of row groups, plus one group at each end
        assert src.rows_read <= 2 * N + 2 * GROUP * (len(got) * B // max(buffer, B) + 1)
