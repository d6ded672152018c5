"""The Ray backend's messages, without a Ray instance: what travels between actors (the real
ids and rows of a batch, `ray_wire.wire_rows` / `pack_rows`) and what a hosted server
answers. The tests that start Ray are in tests/test_ray_backend.py and test_ray_processes.py."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.runtime import ray_backend, ray_ps, ray_wire
from tests.runtime_util import assert_trees


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"])
def test_real_rows_on_the_wire_give_the_same_update(name):
    """A worker actor sends a shard only a batch's n real ids and rows each way (`wire_rows`,
    `pack_rows`): the pulled mini table, padded back, looks up the same embeddings, and a
    push of per-row sums (`unpack_sums`) updates rows and slots as the push of per-entry
    gradients does. The reference sums the entries with numpy (`np.add.at`), not with the
    backend's code."""
    import jax

    from algorithms.runtime import ps as ps_lib
    from recjax.embeddings import make_sparse_optimizer
    from recjax.embeddings.sparse_optim import SparseOptimConfig

    rng = np.random.default_rng(0)
    opt = make_sparse_optimizer(SparseOptimConfig(name=name, lr=0.1))
    vocab, dim, positions = {"a": 50, "b": 7}, {"a": 4, "b": 3}, 64
    tables = {k: rng.normal(size=(v, dim[k])).astype(np.float32) for k, v in vocab.items()}
    slots = {k: jax.device_get(opt.init(jax.numpy.asarray(t))) for k, t in tables.items()}
    rows, local, grads = {}, {}, {}
    for k, v in vocab.items():
        ids = rng.zipf(1.5, positions) % v  # duplicates, as in real batches
        uniq, inv = np.unique(ids, return_inverse=True)
        padded = np.full(positions, v, np.int64)
        padded[:uniq.size] = uniq
        rows[k], local[k] = (padded, uniq.size), inv.astype(np.int32)
        grads[k] = rng.normal(size=(positions, dim[k])).astype(np.float32)
    want = ps_lib.EmbeddingShard(0, tables, slots, opt)
    server = ray_ps.ShardServer(0, SparseOptimConfig(name=name, lr=0.1), tables, slots, None)
    got = server.shard
    wire = ray_wire.wire_rows(rows)  # what travels: the real ids only

    pulled = want.pull(rows)
    back = ray_wire.unpack_rows(server.pull_rows(wire), rows)
    for k in vocab:
        n = rows[k][1]
        assert local[k].max() < n  # a lookup never reaches the filler rows
        np.testing.assert_array_equal(back[k][local[k]], tables[k][rows[k][0][local[k]]])
        assert ray_wire.pack_rows(pulled, rows)[k].shape == (n, dim[k])
        assert not back[k][n:].any()

    want.push(rows, {k: (local[k], grads[k]) for k in vocab})
    sums = {}
    for k in vocab:
        s = np.zeros((positions, dim[k]), np.float32)
        np.add.at(s, local[k], grads[k])
        sums[k] = s
    server.push_rows(wire, ray_wire.pack_rows(sums, rows))
    tol = {"rtol": 1e-6, "atol": 1e-6}
    assert_trees(got.tables, want.tables, **tol)
    assert_trees(got.slots, want.slots, **tol)
    for k in vocab:  # and the update did move every touched row
        assert not np.allclose(got.tables[k][rows[k][0][:rows[k][1]]],
                               tables[k][rows[k][0][:rows[k][1]]])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40), st.integers(0, 9)),
                min_size=1, max_size=4))
def test_rows_on_the_wire_come_back_exactly(shapes):
    """`unwire_rows(wire_rows(rows))` is `rows`: ids, their filler, M and n, for any mix of
    fill (n == M included) and int dtypes; the wire carries the n real ids only."""
    rows = {}
    for i, (size, extra, fill) in enumerate(shapes):
        n = min(size, max(1, size - extra))
        ids = np.full(size, 1000 + fill, np.int64 if i % 2 else np.int32)
        ids[:n] = np.random.default_rng(i).permutation(1000)[:n]
        rows[f"t{i}"] = (ids, n)
    wire = ray_wire.wire_rows(rows)
    back = ray_wire.unwire_rows(wire)
    assert set(back) == set(rows)
    for k, (ids, n) in rows.items():
        assert wire[k][0].size == n
        assert back[k][1] == n and back[k][0].dtype == ids.dtype
        np.testing.assert_array_equal(back[k][0], ids)


def test_a_hosted_server_answers_in_numpy():
    """What a hosted server returns travels as numpy (a jax array pickles at about twice the
    CPU), with its values, tree and the non-array parts unchanged."""
    import jax.numpy as jnp

    class Server:
        def __init__(self, scale):
            self.params = {"w": jnp.arange(6.0).reshape(2, 3) * scale, "b": jnp.ones(3)}
            self.version = 4

        def pull(self):
            return self.params, self.version

        def add(self, g):
            self.params = {k: v + g[k] for k, v in self.params.items()}
            return self.params["b"]

    host = ray_wire._Host(Server, 2.0)
    (params, version) = host.call("pull")
    assert version == 4 and set(params) == {"w", "b"}
    for k, v in params.items():
        assert type(v) is np.ndarray, k
    np.testing.assert_array_equal(params["w"], np.arange(6.0).reshape(2, 3) * 2)
    b = host.call("add", {"w": np.zeros((2, 3)), "b": np.full(3, 0.5)})
    assert type(b) is np.ndarray
    np.testing.assert_array_equal(b, np.full(3, 1.5))


def test_inline_limit_comes_from_the_config():
    """``ray.inline_kb`` sets the local instance's inline limit (KiB -> bytes; a call's inlined
    arguments together up to 4x it); 0 or less is refused with the field's name. The instance
    records no per-call task events or metrics."""
    from recjax.config import RayConfig

    quiet = {"task_events_report_interval_ms": 0, "event_stats": False,
             "enable_metrics_collection": False}
    assert ray_backend.system_config(RayConfig()) == {
        "max_direct_call_object_size": 2**20, "task_rpc_inlined_bytes_limit": 4 * 2**20, **quiet}
    assert ray_backend.system_config(RayConfig(inline_kb=16384)) == {
        "max_direct_call_object_size": 16 * 2**20, "task_rpc_inlined_bytes_limit": 64 * 2**20,
        **quiet}
    with pytest.raises(ValueError, match="ray.inline_kb must be >= 1"):
        RayConfig(inline_kb=0)
