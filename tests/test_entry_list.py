"""GBA's data list read by index in the workers' own processes (``--ray.roles actors``):
`supply.EntryIndex` hands out the indices, `supply.EntryReader` reads entry i's batch; the
batches must be `SharedList`'s entries, whichever worker takes which. And the wait of a role in
another actor on a hosted server (`ray_wire._Host.wait_until`), without Ray."""

import threading
import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.runtime import supply
from recjax.data.seek import Counted
from tests.runtime_util import small_cfg


def _feed(n_train=2048, shuffle=0):
    import dataclasses

    cfg = small_cfg("gba", steps=4, mode="gba", workers=2, local_batch_size=16)
    cfg = dataclasses.replace(cfg, synthetic=dataclasses.replace(cfg.synthetic, n_train=n_train),
                              data=dataclasses.replace(cfg.data, shuffle_buffer=shuffle))
    return supply.Feed(cfg, 16)


@settings(max_examples=15, deadline=None)
@given(order=st.lists(st.integers(0, 2), min_size=1, max_size=40),
       start=st.integers(0, 20), seekable=st.booleans())
def test_readers_sharing_one_index_read_the_shared_lists_entries(order, start, seekable):
    """Three readers take from one `EntryIndex` in a drawn order (over epoch ends: 2048 rows
    make 32 entries of 16 per epoch at M = 4), each reading its entries itself: entry i is
    `SharedList`'s entry i, bit for bit; from a source that seeks each reader reads only its
    own entries' rows. Without seeking (a source read in order) the same batches."""
    feed = _feed()
    m, stop = 4, start + len(order)
    want = feed.shared_list(m, start // m, -(-stop // m), None)
    want_batches = {}
    for _ in range((-(-stop // m)) * m - (start // m) * m):
        i, b = want.take()
        want_batches[i] = b
    want.close()
    index = supply.EntryIndex(start, stop)
    if not seekable:  # a source read in order only
        class InOrder:
            def __init__(self, src):
                self.src = src

            def __getattr__(self, name):
                if name in ("seekable", "take_rows", "src"):
                    raise AttributeError(name)
                return getattr(self.src, name)
        feed.data.train = InOrder(feed.data.train)
    readers = [feed.entries(index, m, lambda b: b) for _ in range(3)]
    got = {}
    for w in order:
        i, b = readers[w].take(w)
        got[i] = b
        for name, x in zip(b._fields, b):
            if x is not None:
                np.testing.assert_array_equal(x, getattr(want_batches[i], name), err_msg=name)
    assert sorted(got) == list(range(start, stop))
    assert readers[0].take(0) is None and index.handed_out() == len(order)
    if seekable:
        for w in range(3):
            reads = feed.data.readers.get(f"worker {w}")
            taken = order.count(w)
            assert (reads.rows if isinstance(reads, Counted) else 0) == 16 * taken


def test_a_wait_in_the_host_returns_when_a_mutating_call_makes_it_true():
    """`_Host.wait_until` checks the condition in the server's process and is woken by the
    server's mutating calls (not by others), returning False after its timeout."""
    from algorithms.runtime.ray_wire import _Host

    class Server:
        def __init__(self):
            self.level = 0

        def bump(self):
            self.level += 1

        def read(self):
            return self.level

        def at_least(self, n):
            return self.level >= n

    host = _Host(Server)
    host.notify_on(("bump",))
    t0 = time.monotonic()
    assert not host.wait_until("at_least", (1,), 0.2)  # nothing moved: times out
    assert 0.2 <= time.monotonic() - t0 < 1.0
    out = []
    t = threading.Thread(target=lambda: out.append(host.wait_until("at_least", (2,), 10)))
    t.start()
    host.call("bump")
    host.call("read")
    time.sleep(0.1)
    assert t.is_alive()  # one bump: not yet
    t0 = time.monotonic()
    host.call("bump")
    t.join(5)
    assert out == [True] and time.monotonic() - t0 < 1.0  # woken by the write, not the poll
