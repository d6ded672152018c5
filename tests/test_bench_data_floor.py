"""The input benchmark's layout floor (`recjax.tools.bench_data`): a read of the same columns as
the Parquet reader, page checksums verified, its ids stored ``[N, F, 1]`` as a batch holds them;
checked against the reader's own raw-id batches (the same stored ids, no hashing) and a
damaged page."""

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from recjax.data.columnar import ParquetSource
from recjax.data.convert import convert
from recjax.tools.bench_data import _layout_floor, _plain_parquet, synthetic_sample


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("floor")
    (d / "a.tsv").write_bytes(synthetic_sample(1500, seed=3))
    convert([f"criteo:{d / 'a.tsv'}"], str(d / "pq"), rows_per_group=512)
    return str(d / "pq")


def _cols(d, kind):
    with open(os.path.join(d, "manifest.json")) as f:
        lay = json.load(f)["layout"]
    return ["row", "label", *(f"dense:{n}" for n in lay["dense_names"]),
            *(f"{kind}:{f['name']}" for f in lay["fields"])]


def test_the_floor_reads_every_row_and_stores_the_ids_as_a_batch_holds_them(dataset):
    assert _plain_parquet(dataset, _cols(dataset, "crc")) == 1500
    assert _plain_parquet(dataset, _cols(dataset, "crc"), floor=True) == 1500
    name = next(n for n in sorted(os.listdir(dataset)) if n.endswith(".parquet"))
    t = pq.ParquetFile(os.path.join(dataset, name)).read_row_group(0, columns=_cols(dataset, "raw"))
    got = _layout_floor(t.column_names, [c.to_numpy() for c in t.columns])
    src = ParquetSource(dataset, raw_ids=True)
    want = next(iter(src.chunks()))
    want = type(want)(*(None if a is None else a[:t.num_rows] for a in want))
    assert got.shape == (t.num_rows, 26, 1)
    # the reader's raw ids are the stored ones with the field's salt added (`add_field`): the
    # difference between two rows of one field is the stored values' difference
    np.testing.assert_array_equal(got[:, :, 0] - got[:1, :, 0],
                                  (want.ids[:, :, 0] - want.ids[:1, :, 0]).astype(got.dtype))


def test_the_floor_verifies_page_checksums(dataset, tmp_path):
    name = next(n for n in sorted(os.listdir(dataset)) if n.endswith(".parquet"))
    bad = tmp_path / "bad"
    bad.mkdir()
    data = bytearray(Path(dataset, name).read_bytes())
    cols = _cols(dataset, "crc")
    for at in range(len(data) // 4, len(data) // 2, 997):  # a flip the plain read misses
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        (bad / name).write_bytes(bytes(flipped))
        try:
            _plain_parquet(str(bad), cols)
        except OSError:
            continue
        with pytest.raises(OSError, match="(?i)checksum|CRC"):
            _plain_parquet(str(bad), cols, floor=True)
        return
    pytest.fail("every flipped byte broke the plain read too")
