"""Raw-id mode of the readers (``raw_ids=True``): a token becomes an exact 64-bit (field, value) id.

recjax/data/hashing.py documents the layout, written out here again with Python integers so a
reader that drops the field, mixes up tags or loses value bits fails against this reference:

    id = field << 56 | tag << 53 | value          (bit 63 = 0; field = the hash salt)
    b""                         tag 1 (missing)  value 0
    8 lowercase hex digits      tag 3 (hex8)     value int(token, 16)
    canonical decimal integer   tag 2 (decimal)  value v mod 2**53, for -2**52 <= v < 2**52
    anything else               tag 4 (hashed)   value splitmix64(len << 32 | crc32) >> 11
"""

import dataclasses
import os
import re
import tempfile
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recjax.batch import concat_chunks
from recjax.config import Config, DataConfig, EmbedConfig
from recjax.data import hashing
from recjax.data.avazu import CAT_NAMES as AVAZU_CATS
from recjax.data.avazu import COLUMNS as AVAZU_COLUMNS
from recjax.data.avazu import AvazuSource
from recjax.data.criteo import CAT_NAMES, CriteoSource
from recjax.data.diskcache import DiskCachedSource
from recjax.data.pipeline import batches
from recjax.data.sources import open_source
from recjax.data.taobao import COLUMNS as TAOBAO_COLUMNS
from recjax.data.taobao import TaobaoSource
from recjax.features import RAW_VOCAB
from recjax.train.data import _open
from tests.conftest import data_path
from tests.test_hashing_props import PROPS, splitmix64  # the published-sequence reference


def reference(token: bytes, field: int) -> int:
    if token == b"":
        tag, value = 1, 0
    elif len(token) == 8 and re.fullmatch(rb"[0-9a-f]{8}", token):
        tag, value = 3, int(token, 16)
    elif (re.fullmatch(rb"-?(0|[1-9][0-9]*)", token) and token != b"-0"
          and len(token) < 30 and -(2**52) <= int(token) < 2**52):
        tag, value = 2, int(token) % 2**53
    else:
        tag, value = 4, splitmix64(len(token) << 32 | zlib.crc32(token)) >> 11
    return field << 56 | tag << 53 | value


def _read(source_cls, data: bytes, **kw):
    fd, path = tempfile.mkstemp(suffix=".txt")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        src = source_cls(path, **kw)
        return src, concat_chunks(list(src.chunks()))
    finally:
        os.remove(path)


def _criteo_line(cats: list[bytes]) -> bytes:
    return b"\t".join([b"1", *[b"3"] * 13, *cats]) + b"\n"


# ----------------------------------------------------------------------------- the layout


def test_golden_values():
    # Pinned: the engine's stores key their rows by these ids, so a change re-keys every row.
    ids = hashing.raw_ids([b"68fd1e64", b"", b"15704", b"-1", b"430548_1007"], 2)
    assert ids.dtype == np.int64
    assert ids.tolist() == [0x0260_0000_68FD_1E64, 0x0220_0000_0000_0000, 0x0240_0000_0000_3D58,
                            0x025F_FFFF_FFFF_FFFF, reference(b"430548_1007", 2)]
    field, tag, value = hashing.unpack_raw(ids)
    assert field.tolist() == [2] * 5
    assert tag.tolist() == [hashing.TAG_HEX8, hashing.TAG_MISSING, hashing.TAG_DECIMAL,
                            hashing.TAG_DECIMAL, hashing.TAG_HASHED]
    assert value[:3].tolist() == [0x68FD1E64, 0, 15704]


def test_forms_and_their_edges():
    tokens = [b"12345678",  # 8 digits: hex8 comes first
              b"0000ffff", b"ABCDEF12", b"0", b"-0", b"007", b"+1", b" 1", b"1_0",
              b"4503599627370495", b"4503599627370496", b"-4503599627370496",
              b"-4503599627370497", b"9" * 5000, b"abc", b"\xff\x00"]
    tags = hashing.unpack_raw(hashing.raw_ids(tokens, 5))[1].tolist()
    assert tags == [3, 3, 4, 2, 4, 4, 4, 4, 4, 2, 4, 2, 4, 4, 4, 4]
    assert hashing.raw_ids(tokens, 5).tolist() == [reference(t, 5) for t in tokens]
    assert hashing.raw_ids([], 0).shape == (0,)
    assert hashing.raw_ids([b"x"], 127)[0] > 0
    with pytest.raises(ValueError, match=r"field_index must be in \[0, 128\)"):
        hashing.raw_ids([b"x"], 128)


hex8 = st.integers(0, 2**32 - 1).map(lambda v: b"%08x" % v)
decimal = st.integers(-(2**53), 2**53).map(lambda v: b"%d" % v)  # some out of range: hashed
padded = st.integers(0, 10**6).map(lambda v: b"0%d" % v)  # leading zero: not canonical
anything = st.binary(max_size=12)
token = st.one_of(hex8, decimal, padded, anything, st.just(b""))


@PROPS
@given(tokens=st.lists(token, min_size=1, max_size=40, unique=True),
       fields=st.lists(st.integers(0, 127), min_size=2, max_size=2, unique=True))
def test_injective_within_a_field_disjoint_across_fields(tokens, fields):
    a, b = (hashing.raw_ids(tokens, f) for f in fields)
    assert a.tolist() == [reference(t, fields[0]) for t in tokens]
    assert len(set(a.tolist())) == len(tokens)  # distinct tokens, distinct ids
    assert not set(a.tolist()) & set(b.tolist())  # never equal across fields
    assert (a > 0).all()  # 0 is only ever padding
    again = hashing.raw_ids(tokens[::-1], fields[0])  # an id depends on its token only
    assert again.tolist() == a[::-1].tolist()


# ----------------------------------------------------------------------------- the readers


def test_criteo_ids():
    cats = [[b"68fd1e64"] * 26, [b"80e26c9b"] * 26, [b""] * 26, [b"68fd1e64"] * 26]
    src, c = _read(CriteoSource, b"".join(map(_criteo_line, cats)), raw_ids=True)
    assert {f.vocab_size for f in src.spec.fields} == {RAW_VOCAB}
    assert all(f.raw_ids for f in src.spec.fields)
    ids = c.ids[:, :, 0]
    assert c.ids.dtype == np.int64 and c.ids.shape == (4, 26, 1)
    assert ids[0, 2] == 2 << 56 | 3 << 53 | 0x68FD1E64  # C3 = 68fd1e64
    assert ids[2, 0] == 1 << 53 and ids[2, 25] == 25 << 56 | 1 << 53  # missing, per field
    np.testing.assert_array_equal(ids[0], ids[3])  # equal tokens, equal fields: equal ids
    assert len(set(ids[:3].ravel().tolist())) == 3 * 26  # every other (field, token) its own id
    assert src.raw_hashed == {}
    _, hashed_mode = _read(CriteoSource, b"".join(map(_criteo_line, cats)))
    for a, b in [(c.dense, hashed_mode.dense), (c.label, hashed_mode.label)]:
        np.testing.assert_array_equal(a, b)  # only the ids depend on the mode


@PROPS
@given(tokens=st.lists(st.binary(max_size=6).map(lambda b: b.hex().encode()), min_size=2,
                       max_size=8, unique=True))
def test_criteo_fields_never_share_an_id(tokens):
    src, c = _read(CriteoSource, b"".join(_criteo_line([t] * 26) for t in tokens), raw_ids=True)
    ids = c.ids[:, :, 0]
    np.testing.assert_array_equal(ids.T, [[reference(t, k) for t in tokens]
                                          for k in range(len(CAT_NAMES))])
    assert len(set(ids.ravel().tolist())) == ids.size
    hashed = sum(1 for t in tokens if reference(t, 0) >> 53 & 7 == 4)
    assert sum(src.raw_hashed.values()) == 26 * hashed


def _avazu_line(cats: list[bytes], hour: bytes = b"14102100") -> bytes:
    return b",".join([b"1", b"0", hour, *cats]) + b"\n"


def test_avazu_ids():
    forms = [b"1fbe01fe", b"15704", b"-1", b"", b"a_b"]
    lines = [_avazu_line([t] * 21, hour=b"14102213") for t in forms] + [_avazu_line([forms[0]] * 21)]
    src, c = _read(AvazuSource, b"".join(lines), raw_ids=True)
    _, hashed_mode = _read(AvazuSource, b"".join(lines))
    assert [f.vocab_size for f in src.spec.fields[:2]] == [24, 7]  # exact fields keep theirs
    assert {f.vocab_size for f in src.spec.fields[2:]} == {RAW_VOCAB}
    assert c.ids.dtype == np.int64
    np.testing.assert_array_equal(c.ids[:, :2], hashed_mode.ids[:, :2])  # hour, weekday
    cats = c.ids[:, 2:, 0]
    np.testing.assert_array_equal(cats.T, [[reference(t, k) for t in forms + [forms[0]]]
                                           for k in range(2, 23)])
    c20 = 2 + AVAZU_CATS.index("C20")
    assert c.ids[2, c20, 0] == c20 << 56 | 2 << 53 | (2**53 - 1)  # C20 = -1, exact
    assert len(set(cats[:5].ravel().tolist())) == 5 * 21
    np.testing.assert_array_equal(cats[0], cats[5])
    assert src.raw_hashed == {name: 1 for name in AVAZU_CATS}  # "a_b", once per column


TAOBAO_HEADER = b",".join(c.encode() for c in TAOBAO_COLUMNS) + b"\n"


def _taobao_line(tok: bytes, seq: bytes) -> bytes:
    row = [b"1", b"2017-05-08 13:00:00"] + [tok] * 16 + [seq]
    row[TAOBAO_COLUMNS.index("price")] = b"1.5"
    return b",".join(row) + b"\n"


def test_taobao_ids_share_the_adgroup_table():
    lines = [_taobao_line(b"555", b"9^555^x_1"), _taobao_line(b"x_1", b""),
             _taobao_line(b"", b"555")]
    src, c = _read(TaobaoSource, TAOBAO_HEADER + b"".join(lines), raw_ids=True, multi_hot_len=4)
    _, hashed_mode = _read(TaobaoSource, TAOBAO_HEADER + b"".join(lines), multi_hot_len=4)
    names = [f.name for f in src.spec.fields]
    ad, seq = names.index("adgroup_id"), names.index("click_sequence")
    assert c.ids.dtype == np.int64
    np.testing.assert_array_equal(c.mask, hashed_mode.mask)
    np.testing.assert_array_equal(c.ids[:, :2], hashed_mode.ids[:, :2])  # hour, weekday
    assert c.ids[0, seq, :3].tolist() == [reference(b"9", ad), reference(b"555", ad),
                                          reference(b"x_1", ad)]
    assert c.ids[0, seq, 1] == c.ids[0, ad, 0] == c.ids[2, seq, 0]  # shared table, shared id
    assert c.ids[0, seq, 2] == c.ids[1, ad, 0]  # hashed token, same table: same id too
    assert (c.ids[c.mask == 0] == 0).all()  # padding stays 0, never a real raw id
    one_hot = [k for k, n in enumerate(names) if n not in ("hour_of_day", "weekday", "click_sequence")]
    assert len({tuple(c.ids[:, k, 0]) for k in one_hot}) == 15
    for k in one_hot:
        assert c.ids[:, k, 0].tolist() == [reference(t, k) for t in (b"555", b"x_1", b"")]
    # x_1 once in each of the 15 one-hot fields and once in the sequence
    assert src.raw_hashed == {**{names[k]: 1 for k in one_hot}, "click_sequence": 1}


def test_off_is_unchanged():
    """raw_ids=False is the default and the hashed ids of before (the golden value of
    tests/test_hashing_props.py: C3 = 68fd1e64 -> bucket 20,641 of 2**17)."""
    cats = [b"0"] * 26
    cats[2] = b"68fd1e64"
    src, c = _read(CriteoSource, _criteo_line(cats), raw_ids=False)
    assert c.ids.dtype == np.int32 and c.ids[0, 2, 0] == 20_641
    assert {f.vocab_size for f in src.spec.fields} == {1 << 17}
    _, default = _read(CriteoSource, _criteo_line(cats))
    np.testing.assert_array_equal(c.ids, default.ids)


# ----------------------------------------------------------------------------- real samples


def _columns(path, delimiter: str, skip_header: bool) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\r\n").split(delimiter) for line in f]
    return list(zip(*rows[1 if skip_header else 0:]))


def test_criteo_sample_raw_ids_are_the_distinct_tokens():
    path = data_path("criteo_kaggle_8k", "train.tsv")
    raw = open_source(f"criteo:{path}", raw_ids=True)
    ids = concat_chunks(list(raw.chunks())).ids[:, :, 0]
    buckets = concat_chunks(list(open_source(f"criteo:{path}").chunks())).ids[:, :, 0]
    cols = _columns(path, "\t", skip_header=False)[14:]
    assert raw.raw_hashed == {}  # every token is 8 hex digits or missing: no collision at all
    for k in range(26):
        n_tokens = len(set(cols[k]))
        assert len(np.unique(ids[:, k])) == n_tokens >= len(np.unique(buckets[:, k])), k
    for k in (0, 2, 11, 25):  # token <-> id is a bijection, and the value is the token's
        pairs = set(zip(cols[k], ids[:, k].tolist()))
        assert len(pairs) == len(set(cols[k])), k
        for tok, i in pairs:
            assert i == reference(tok.encode(), k), (k, tok)


def test_avazu_sample_raw_ids_are_the_distinct_tokens():
    path = data_path("avazu_9k", "train.csv")
    raw = open_source(f"avazu:{path}", raw_ids=True)
    ids = concat_chunks(list(raw.chunks())).ids[:, :, 0]
    cols = _columns(path, ",", skip_header=True)
    assert raw.raw_hashed == {}  # hex ids and (signed) decimal integers only
    for k, name in enumerate(AVAZU_CATS, start=2):
        tokens = cols[AVAZU_COLUMNS.index(name)]
        assert len(np.unique(ids[:, k])) == len(set(tokens)), name
        assert len(set(zip(tokens, ids[:, k].tolist()))) == len(set(tokens)), name


def test_taobao_sample_hashes_only_pid():
    src = TaobaoSource(data_path("taobao_ad_tiny", "train_sample.csv"), raw_ids=True)
    c = concat_chunks(list(src.chunks()))
    assert src.raw_hashed == {"pid": 100}  # "430548_1007": the one non-integer column
    raw = c.ids[:, 2:]  # after hour_of_day and weekday, whose exact ids include 0
    assert (raw[c.mask[:, 2:] == 1] > 0).all() and (raw[c.mask[:, 2:] == 0] == 0).all()


@pytest.mark.parametrize("spec", ["frappe:frappe/frappe.train.libfm",
                                  "movielens:movielens_100k/u.data"])
def test_exact_sources_keep_their_ids(spec):
    kind, _, rel = spec.partition(":")
    path = data_path(*rel.split("/"))
    raw, plain = (open_source(f"{kind}:{path}", raw_ids=r) for r in (True, False))
    assert raw.spec == plain.spec  # exact vocabularies: nothing to replace
    a, b = (concat_chunks(list(s.chunks())) for s in (raw, plain))
    assert a.ids.dtype == np.int64 and b.ids.dtype == np.int32
    np.testing.assert_array_equal(a.ids, b.ids)


# ----------------------------------------------------------------------------- downstream


def _criteo_file(tmp_path, n=23):
    rng = np.random.default_rng(0)
    lines = [_criteo_line([b"%08x" % v if v % 5 else b"" for v in rng.integers(0, 2**32, 26)])
             for _ in range(n)]
    p = tmp_path / "d.tsv"
    p.write_bytes(b"".join(lines))
    return p


def test_batches_keep_int64(tmp_path):
    src = open_source(f"criteo:{_criteo_file(tmp_path)}", raw_ids=True, chunk_rows=5)
    want = concat_chunks(list(src.chunks())).ids
    out = list(batches(src, 7, seed=1, epoch=0, shuffle_buffer=6, drop_remainder=False))
    ids = np.concatenate([b.ids[:n] for b, n in out])
    assert all(b.ids.dtype == np.int64 for b, _ in out)
    assert sorted(map(tuple, ids[:, :, 0].tolist())) == sorted(map(tuple, want[:, :, 0].tolist()))
    last, n = out[-1]
    assert n == 23 % 7 and (last.ids[n:] == 0).all()  # padding rows


def test_disk_cache_keys_on_raw_ids(tmp_path):
    f = _criteo_file(tmp_path)
    opts = {"hash_buckets": 97, "skip_bad_lines": False, "multi_hot_len": 20}
    make = lambda raw: DiskCachedSource(open_source(f"criteo:{f}", **opts, raw_ids=raw),
                                        str(tmp_path / "c"), dict(opts, raw_ids=raw))
    plain, raw = make(False), make(True)
    assert plain.directory != raw.directory
    parsed = concat_chunks(list(raw.chunks())).ids
    replayed = concat_chunks(list(make(True).chunks())).ids
    assert replayed.dtype == np.int64
    np.testing.assert_array_equal(parsed, replayed)


def test_run_data_passes_raw_ids_for_lru_store(tmp_path):
    f = _criteo_file(tmp_path)
    base = dataclasses.replace(Config(), data=DataConfig(train=f"criteo:{f}"))
    lru = dataclasses.replace(base, embed=EmbedConfig(store="lru"))
    for cfg, dtype, vocab in [(base, np.int32, 1 << 17), (lru, np.int64, RAW_VOCAB)]:
        src = _open(cfg, cfg.data.train)
        assert {fs.vocab_size for fs in src.spec.fields} == {vocab}
        assert next(iter(src.chunks())).ids.dtype == dtype
