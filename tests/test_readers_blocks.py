"""The text readers' whole-block path (recjax/data/readers.py `split_block`, Criteo's
`convert_block`): pyarrow splits a block, numpy checks and converts it, and at the first doubt
the block goes token by token. Property: for any file, the chunks (ids hashed or raw, dense,
labels, rows), counters and errors are those of the token-by-token path alone.

The files mix good lines with values at the edges of what either path accepts: leading zeros,
``-0``, int64's limits and one past them, ``+1``, ``0x1``, `` 1``, ``1e3``, hex of any length,
upper-case hex, empty fields, CRLF, a lone CR, an empty line, a field too many or too few.
"""

import os
import tempfile

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from recjax.data import readers
from recjax.data.base import DataError
from recjax.data.criteo import CriteoSource
from recjax.data.sources import open_source
from tests.conftest import spy_blocks

PROPS = settings(database=None, derandomize=True, deadline=None, max_examples=100)

edge_ints = st.sampled_from([b"", b"0", b"-0", b"007", b"-1", b"9223372036854775807",
                             b"-9223372036854775808", b"9223372036854775808", b"+1", b"0x1",
                             b" 1", b"1e3", b"-", b"1-2", b"\xff"])
hexes = st.text("0123456789abcdef", max_size=9).map(str.encode)
edge_hex = st.sampled_from([b"", b"ABCDEF12", b"68fd1e6", b"68fd1e64a", b"0x12", b"\x00"])


@st.composite
def criteo_lines(draw) -> bytes:
    lines = []
    for _ in range(draw(st.integers(1, 9))):
        odd = draw(st.integers(0, 5)) == 0  # most lines plainly good, so blocks go fast
        label = draw(st.sampled_from([b"0", b"1", b"2", b""] if odd else [b"0", b"1"]))
        dense = [draw(edge_ints if odd else st.integers(-3, 10**6).map(lambda v: b"%d" % v))
                 for _ in range(13)]
        cats = [draw(st.one_of(hexes, edge_hex) if odd else hexes) for _ in range(26)]
        fields = [label, *dense, *cats]
        shape = draw(st.sampled_from(["ok"] * 8 + ["short", "long", "empty"])) if odd else "ok"
        if shape == "short":
            fields = fields[:-1]
        elif shape == "long":
            fields.append(b"x")
        line = b"" if shape == "empty" else b"\t".join(fields)
        lines.append(line + draw(st.sampled_from([b"\n", b"\r\n", b"\r"] if odd else [b"\n"])))
    data = b"".join(lines)
    return data[:-1] if draw(st.booleans()) and data.endswith(b"\n") else data


def _pass(path: str, fast: bool, **opts):
    try:
        src = open_source(f"criteo:{path}", **opts)
        if not fast:
            src.convert_block = None  # the token-by-token path alone
        chunks = list(src.chunks())
    except DataError as e:
        return str(e)
    return chunks, src.stats.as_dict(), dict(src.raw_hashed)


@PROPS
@given(criteo_lines(), st.sampled_from([{}, {"raw_ids": True}, {"hash_buckets": 1000},
                                        {"skip_bad_lines": True},
                                        {"skip_bad_lines": True, "raw_ids": True}]))
def test_whole_blocks_read_as_token_by_token(data, opts):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.tsv")
        with open(path, "wb") as f:
            f.write(data)
        fast, slow = _pass(path, True, **opts), _pass(path, False, **opts)
    if isinstance(slow, str):
        assert fast == slow
        return
    (cf, sf, hf), (cs, ss, hs) = fast, slow
    assert (sf, hf) == (ss, hs)
    assert [c.size for c in cf] == [c.size for c in cs]
    for a, b in zip(cf, cs):
        for x, y in zip(a, b):
            if y is None:
                assert x is None
            else:
                assert x.dtype == y.dtype
                np.testing.assert_array_equal(x, y)


def test_the_fast_path_runs_and_declines(tmp_path, monkeypatch):
    """Good blocks are converted whole; a block with one bad value goes token by token (and is
    named there), the blocks around it still whole."""
    good = b"1\t" + b"\t".join([b"5"] * 13) + b"\t" + b"\t".join([b"68fd1e64"] * 26) + b"\n"
    bad = good.replace(b"68fd1e64", b"68FD1E64", 1)
    path = tmp_path / "x.tsv"
    path.write_bytes(good * 5 + bad + good * 4)
    monkeypatch.setattr(readers, "PARSE_BLOCK", 3)
    calls = spy_blocks(monkeypatch, CriteoSource)
    src = CriteoSource(path, skip_bad_lines=True)
    rows = np.concatenate([c.row for c in src.chunks()])
    assert calls == [True, False, True, True] and rows.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert src.stats.first_skipped == [f"{path}:6: field 'C1': not a hex id: got '68FD1E64', "
                                       "expected lowercase hex digits (or nothing for a missing "
                                       "value). Fix or remove the line, or pass --skip-bad-lines "
                                       "to skip such lines"]
