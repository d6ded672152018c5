"""algorithms/runtime/codec.py: the cases mutation testing found unpinned (docs/testing.md).

Expected values are written out here in numpy (a loop over the batch), never taken from the
codec; each docstring names the mutant it kills (``line: old -> new``).
"""

import numpy as np
import pytest

from algorithms.runtime.codec import decode_fp16, decode_ids, encode_fp16, encode_ids


def test_occurrences_are_listed_in_batch_order():
    """Each unique id's occurrences are its entries in batch order (sample, then position), as
    a loop over the batch lists them: the message is deterministic, not just decodable. Kills
    ``np.argsort(inverse, kind="stable")`` -> the default (unstable) sort (codec.py:178)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(-20, 30, (64, 5, 3)).astype(np.int64)  # 960 entries, ~50 distinct ids
    msg = encode_ids(ids)
    want: dict[int, list[tuple[int, int]]] = {}
    for b in range(64):
        for f in range(5):
            for j in range(3):
                want.setdefault(int(ids[b, f, j]), []).append((b, f * 3 + j))
    assert msg.unique.tolist() == sorted(want)
    for u, key in enumerate(msg.unique.tolist()):
        lo, hi = int(msg.offsets[u]), int(msg.offsets[u + 1])
        got = list(zip(msg.sample[lo:hi].tolist(), msg.position[lo:hi].tolist()))
        assert got == want[key], key


@pytest.mark.parametrize("field", ["unique", "offsets", "sample", "position"])
def test_a_message_with_one_wrong_length_is_refused(field):
    """decode_ids checks every length (U + 1 offsets ending at N, N samples and positions), each
    on its own. Kills ``and -> or`` in that check (codec.py:196-197)."""
    ids = np.arange(24, dtype=np.int64).reshape(2, 3, 4) % 5
    msg = encode_ids(ids)
    bad = msg._replace(**{field: getattr(msg, field)[:-1]})
    with pytest.raises(ValueError, match="decode_ids: malformed message for shape"):
        decode_ids(bad)


def test_a_single_block_of_one_dimension():
    """A 1-D float32 array is one block ``[D]`` (the docstring's ``x[..., D]`` with no leading
    axes): accepted, one norm. Kills ``x.ndim < 1 -> <= 1 / < 2`` (codec.py:221).

    kappa = 4, v = [1, -0.5, 0.25]: ||v||_inf = 1, q = [4, -2, 1] exactly, and back exactly."""
    x = np.array([1.0, -0.5, 0.25], np.float32)
    msg = encode_fp16(x, 4.0)
    assert msg.norm.shape == () and float(msg.norm) == 1.0
    assert msg.q.tolist() == [4.0, -2.0, 1.0]
    assert decode_fp16(msg).tolist() == [1.0, -0.5, 0.25]
    with pytest.raises(ValueError, match="expected float32 values"):
        encode_fp16(np.float32(1.0), 4.0)
