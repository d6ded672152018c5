"""Avazu's whole-block path (recjax/data/avazu.py `convert_block`) against its token-by-token
path alone: the chunks (ids hashed or raw, labels, rows), counters and errors are equal, on the
shared samples and on hypothesis-generated files whose lines mix good values with the edges of
what either path accepts: hours that are not dates (``14023100``, hour 24, ``-1``, leading
zeros, empty), labels other than 0/1, categories with spaces at an edge or inside, NUL, bytes
that are not UTF-8 and UTF-8 that is not ASCII, decimal and hex tokens of any length, CRLF, a
lone CR, an empty line, a field too many or too few, a header.
"""

import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjax.data import readers
from recjax.data.avazu import AvazuSource
from recjax.data.base import DataError
from recjax.data.sources import open_source
from tests.conftest import data_path, spy_blocks

PROPS = settings(database=None, derandomize=True, deadline=None, max_examples=100)

good_hours = st.sampled_from([b"14102100", b"14102123", b"14103015", b"14102901", b"14102500",
                              b"14102607", b"14102418", b"14102722"])  # Tue..Mon
EDGE_HOURS = [b"", b"114102100", b"14023100", b"14102124", b"-1", b"014102100", b"1410210", b"+14102100",
              b"14102100 ", b"x", b"99999999999999999999"]
EDGE_CATS = [b"", b" 79", b"79 ", b"a b", b"\x00", b"\xff", "é".encode(), b"ABCDEF12", b"-0",
             b"007"]
edge_hours = st.sampled_from(EDGE_HOURS)
cats = st.one_of(st.text("0123456789abcdef", min_size=1, max_size=9).map(str.encode),
                 st.integers(-1, 10**6).map(lambda v: b"%d" % v))
edge_cats = st.sampled_from(EDGE_CATS)


@st.composite
def avazu_lines(draw) -> bytes:
    lines = [b"id,click,hour," + b",".join(c.encode() for c in AvazuSource.columns[3:])
             ] if draw(st.booleans()) else []
    for i in range(draw(st.integers(1, 9))):
        # most lines plainly good, so blocks go fast; an odd line has one odd thing, so that the
        # block path meets each edge alone (not always beside one that sends it token by token)
        odd = draw(st.sampled_from([None] * 5 + ["label", "hour", "cat", "shape", "end"]))
        label = draw(st.sampled_from([b"0", b"1", b"2", b""] if odd == "label" else [b"0", b"1"]))
        hour = draw(edge_hours if odd == "hour" else good_hours)
        values = [draw(cats) for _ in range(21)]
        if odd == "cat":
            values[draw(st.integers(0, 20))] = draw(edge_cats)
        fields = [b"%d" % (10**19 + i), label, hour, *values]
        shape = draw(st.sampled_from(["short", "long", "empty"])) if odd == "shape" else "ok"
        if shape == "short":
            fields = fields[:-1]
        elif shape == "long":
            fields.append(b"x")
        line = b"" if shape == "empty" else b",".join(fields)
        lines.append(line + draw(st.sampled_from([b"\r\n", b"\r"] if odd == "end" else [b"\n"])))
    data = b"".join(line if line.endswith((b"\n", b"\r")) else line + b"\n" for line in lines)
    return data[:-1] if draw(st.booleans()) and data.endswith(b"\n") else data


def _pass(path: str, fast: bool, **opts):
    try:
        src = open_source(f"avazu:{path}", **opts)
        if not fast:
            src.convert_block = None  # the token-by-token path alone
        chunks = list(src.chunks())
    except DataError as e:
        return str(e)
    return chunks, src.stats.as_dict(), dict(src.raw_hashed)


def _assert_same(fast, slow):
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


OPTS = [{}, {"raw_ids": True}, {"hash_buckets": 1000}, {"skip_bad_lines": True},
        {"skip_bad_lines": True, "raw_ids": True}]


@PROPS
@given(avazu_lines(), st.sampled_from(OPTS))
def test_avazu_whole_blocks_read_as_token_by_token(data, opts):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.csv")
        with open(path, "wb") as f:
            f.write(data)
        _assert_same(_pass(path, True, **opts), _pass(path, False, **opts))


@pytest.mark.parametrize("name", ["train.csv", "valid.csv"])
@pytest.mark.parametrize("opts", [{}, {"raw_ids": True}])
def test_avazu_samples_read_as_token_by_token(name, opts, monkeypatch):
    """The shared samples, every block whole (the spy counts), equal to token by token."""
    path = str(data_path("avazu_9k", name))
    calls = spy_blocks(monkeypatch, AvazuSource)
    fast = _pass(path, True, **opts)
    assert calls and all(calls)
    _assert_same(fast, _pass(path, False, **opts))


GOOD = b"1,0,14102100,1005,0," + b",".join([b"1fbe01fe"] * 9) + b"," + b",".join(
    [b"15704"] * 10) + b"\n"
EDGES = ([("click", v) for v in (b"2", b"", b"00")]
         + [("hour", v) for v in EDGE_HOURS]
         + [(c, v) for c in ("site_id", "C21") for v in EDGE_CATS])


@pytest.mark.parametrize("field,value", EDGES)
@pytest.mark.parametrize("opts", [{}, {"skip_bad_lines": True, "raw_ids": True}])
def test_avazu_each_edge_alone_reads_as_token_by_token(field, value, opts, tmp_path):
    """Every edge value above, alone in a line between good ones (the hypothesis test meets
    them mixed; here each is sure to be met)."""
    cols = GOOD.rstrip(b"\n").split(b",")
    cols[AvazuSource.columns.index(field)] = value
    path = tmp_path / "x.csv"
    path.write_bytes(GOOD + b",".join(cols) + b"\n" + GOOD)
    _assert_same(_pass(str(path), True, **opts), _pass(str(path), False, **opts))


def test_avazu_fast_path_declines_a_bad_block(tmp_path, monkeypatch):
    """A block with a bad hour goes token by token and is named there (file:line, field); the
    blocks around it stay whole."""
    good = GOOD
    bad = good.replace(b"14102100", b"14023100")
    path = tmp_path / "x.csv"
    path.write_bytes(good * 5 + bad + good * 4)
    monkeypatch.setattr(readers, "PARSE_BLOCK", 3)
    calls = spy_blocks(monkeypatch, AvazuSource)
    src = AvazuSource(path, skip_bad_lines=True)
    rows = np.concatenate([c.row for c in src.chunks()])
    assert calls == [True, False, True, True] and rows.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert src.stats.first_skipped[0].startswith(f"{path}:6: field 'hour': bad hour: got "
                                                 "'14023100'")
