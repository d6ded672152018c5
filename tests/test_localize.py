"""`ps.localize`: every field's ids at once (`_localize_fields`) give what a `np.unique` per
table gives, written out here as the reference: raw 64-bit ids, many duplicates, multi-hot
rows, and tables that share their fields (``emb/x`` with ``wide/x``)."""

import dataclasses

import numpy as np
import pytest

from algorithms.runtime import ps
from recjax import configs
from recjax.batch import Batch
from recjax.data.synthetic import SyntheticSource
from recjax.models.config import ModelConfig
from recjax.train.setup import make_model


def reference(layout, ids):
    """Per table: its fields' unique ids padded with V to their count, and each id's row."""
    local, rows = np.zeros(ids.shape, np.int32), {}
    for t in layout.tables:
        block = ids[:, t.field_index, :]
        uniq = sorted(set(block.ravel().tolist()))
        row = {v: i for i, v in enumerate(uniq)}
        local[:, t.field_index, :] = np.vectorize(row.get, otypes=[np.int32])(block)
        rows[t.name] = (np.array(uniq + [t.num_embeddings] * (block.size - len(uniq)), np.int64),
                        len(uniq))
    return local, rows


@pytest.mark.parametrize("model", ["dlrm", "wide_deep"])
@pytest.mark.parametrize("ids", ["hashed", "raw", "duplicates", "multi_hot"])
def test_localize_is_a_unique_per_table(model, ids):
    cfg = dataclasses.replace(configs.smoke(), model=ModelConfig.smoke(model))
    spec = SyntheticSource(cfg.synthetic).spec
    layout = make_model(cfg, spec).layout
    rng = np.random.default_rng(len(model) + len(ids))
    f = len(spec.fields)
    shape = (16, f, 3 if ids == "multi_hot" else 1)
    high = {"hashed": 50, "raw": 2**62, "duplicates": 3, "multi_hot": 20}[ids]
    batch_ids = rng.integers(0, high, shape, dtype=np.int64 if ids == "raw" else np.int32)
    b = Batch(np.zeros((16, 1), np.float32), batch_ids, None, np.zeros(16, np.float32))
    want_local, want_rows = reference(layout, batch_ids)
    got, rows = ps.localize(layout, b)
    np.testing.assert_array_equal(got.ids, want_local)
    assert got.ids.dtype == np.int32 and rows.keys() == want_rows.keys()
    for name, (padded, n) in want_rows.items():
        assert rows[name][1] == n
        np.testing.assert_array_equal(rows[name][0], padded)
