"""Bad input: every case raises DataError with file:line, the field and what to do, or, with
``skip_bad_lines``, drops the line and counts it. Never a silent wrong value."""

import numpy as np
import pytest

from recjax.batch import concat_chunks
from recjax.data import readers
from recjax.data.avazu import AvazuSource
from recjax.data.base import DataError
from recjax.data.criteo import CriteoCSVSource, CriteoSource
from recjax.data.libfm import FrappeSource
from recjax.data.movielens import MovieLensSource
from recjax.data.sources import open_source
from recjax.data.taobao import COLUMNS as TAOBAO_COLUMNS
from recjax.data.taobao import TaobaoSource

SKIP = "--skip-bad-lines"


def criteo_line(label=b"0", ints=None, cats=None) -> bytes:
    ints = ints or [b"1", b"", b"-1"] + [b"%d" % i for i in range(10)]
    cats = cats or [b"%08x" % (i * 7919) for i in range(25)] + [b""]
    return b"\t".join([label, *ints, *cats]) + b"\n"


def with_field(**kw) -> bytes:
    """A Criteo line with one field replaced: with_field(I5=b'x') or with_field(C3=b'zz')."""
    (name, value), = kw.items()
    line = criteo_line().rstrip(b"\n").split(b"\t")
    cols = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    line[cols.index(name)] = value
    return b"\t".join(line) + b"\n"


def write(tmp_path, lines: list[bytes], name="data.txt"):
    p = tmp_path / name
    p.write_bytes(b"".join(lines))
    return p


def read(source):
    return concat_chunks(list(source.chunks()))


def assert_error(err: DataError, path, line: int, field: str | None, *words: str):
    msg = str(err)
    assert msg.startswith(f"{path}:{line}: "), msg
    if field:
        assert f"field {field!r}" in msg, msg
    assert SKIP in msg, msg
    for w in words:
        assert w in msg, msg


CRITEO_CASES = [  # (bad line, field, words in the message)
    (criteo_line().replace(b"\t", b"", 1)[:-1] + b"\n", None, ["expected 40 tab-separated"]),
    (criteo_line()[:-1] + b"\textra\n", "C26", ["got 41"]),
    (b"\n", None, ["empty line"]),
    (with_field(I5=b"1.5"), "I5", ["not an integer", "1.5"]),
    (with_field(I2=b"12a"), "I2", ["not an integer"]),
    (with_field(I7=b"99999999999999999999999"), "I7", ["out of range"]),
    (with_field(I1=b"\xff\xfe"), "I1", ["not an integer", "\\xff"]),
    (with_field(C3=b"\xff\xfe\x00\x01"), "C3", ["not a hex id", "\\xff"]),
    (with_field(C9=b"68FD1E64"), "C9", ["lowercase hex"]),
    (with_field(label=b"2"), "label", ["bad label", "'2'", "{0, 1}"]),
    (with_field(label=b""), "label", ["bad label"]),
    (with_field(label=b"\xff"), "label", ["bad label"]),
]


@pytest.mark.parametrize("bad,field,words", CRITEO_CASES)
def test_criteo_bad_line_raises(tmp_path, bad, field, words):
    p = write(tmp_path, [criteo_line(), criteo_line(b"1"), bad, criteo_line()])
    with pytest.raises(DataError) as e:
        read(CriteoSource(p))
    assert_error(e.value, p, 3, field, *words)
    if field:
        assert e.value.field == field and e.value.line == 3


@pytest.mark.parametrize("bad,field,words", CRITEO_CASES)
def test_criteo_bad_line_skipped_and_counted(tmp_path, bad, field, words):
    p = write(tmp_path, [criteo_line(), criteo_line(b"1"), bad, criteo_line()])
    src = CriteoSource(p, skip_bad_lines=True)
    c = read(src)
    assert c.row.tolist() == [0, 1, 3]  # the skipped line keeps its index
    assert c.label.tolist() == [0.0, 1.0, 0.0]
    assert src.stats.rows == 3 and sum(src.stats.skipped.values()) == 1
    assert src.stats.first_skipped[0].startswith(f"{p}:3: ")
    assert np.isfinite(c.dense).all()


def test_first_bad_line_in_file_order_across_blocks(tmp_path):
    lines = [criteo_line()] * 9 + [with_field(I4=b"x")] + [criteo_line()] * 3 + [b"short\n"]
    p = write(tmp_path, lines)
    with pytest.raises(DataError) as e:
        read(CriteoSource(p, chunk_rows=4))  # the bad line is in the third block
    assert_error(e.value, p, 10, "I4", "not an integer")
    src = CriteoSource(p, chunk_rows=4, skip_bad_lines=True)
    c = read(src)
    assert c.size == 12 and 9 not in c.row and 13 not in c.row
    assert dict(src.stats.skipped) == {"not an integer": 1, "field count": 1}
    assert src.stats.as_dict()["skipped_lines"] == 2


def test_line_endings_and_slow_path_parse_alike(tmp_path):
    good = [criteo_line(b"%d" % (i % 2), cats=[b"%08x" % (i * 31 + k) for k in range(26)])
            for i in range(6)]
    a = read(CriteoSource(write(tmp_path, good, "plain.tsv")))
    crlf = [ln.replace(b"\n", b"\r\n") for ln in good]
    crlf[-1] = crlf[-1].rstrip(b"\r\n")  # and no newline at the end of the file
    b = read(CriteoSource(write(tmp_path, crlf, "crlf.tsv")))
    # a bad line sends its block through the per-line (slow) path
    c = read(CriteoSource(write(tmp_path, good[:3] + [b"bad\n"] + good[3:], "bad.tsv"),
                          skip_bad_lines=True))
    assert c.row.tolist() == [0, 1, 2, 4, 5, 6]
    for x, y, z in zip(a[:4], b[:4], c[:4]):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)


def test_parse_blocks_and_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "PARSE_BLOCK", 3)  # several parse blocks per yielded chunk
    lines = [criteo_line(b"%d" % (i % 2)) for i in range(20)]
    lines[11] = with_field(C26=b"XYZ")
    p = write(tmp_path, lines)
    with pytest.raises(DataError) as e:
        read(CriteoSource(p, chunk_rows=5))
    assert_error(e.value, p, 12, "C26", "not a hex id")
    src = CriteoSource(p, chunk_rows=5, skip_bad_lines=True)
    chunks = list(src.chunks())
    assert [c.size for c in chunks] == [5, 5, 5, 4]
    assert np.concatenate([c.row for c in chunks]).tolist() == [i for i in range(20) if i != 11]
    assert src.stats.rows == 19


def test_all_lines_bad_gives_no_rows(tmp_path):
    p = write(tmp_path, [with_field(label=b"7")] * 3)
    src = CriteoSource(p, skip_bad_lines=True)
    assert list(src.chunks()) == [] and src.stats.skipped["bad label"] == 3


def test_missing_file(tmp_path):
    p = tmp_path / "nope.tsv"
    with pytest.raises(DataError, match="no such file") as e:
        CriteoSource(p)
    assert str(p) in str(e.value) and "Check the path" in str(e.value)
    with pytest.raises(DataError, match="no such file"):
        open_source(f"avazu:{p}")
    with pytest.raises(DataError, match="not a regular file"):
        CriteoSource(tmp_path)


@pytest.mark.parametrize("cls", [CriteoSource, CriteoCSVSource, AvazuSource, FrappeSource,
                                 MovieLensSource, TaobaoSource])
def test_empty_file(tmp_path, cls):
    p = write(tmp_path, [])
    with pytest.raises(DataError, match="empty file") as e:
        cls(p)
    assert str(e.value).startswith(str(p))


def test_header_only(tmp_path):
    p = write(tmp_path, [b",".join(c.encode() for c in TAOBAO_COLUMNS) + b"\n"])
    with pytest.raises(DataError, match="only a header"):
        TaobaoSource(p)


# ----------------------------------------------------------------------------- criteo-csv


CSV_HEADER = b"Id,Label," + b",".join(b"I%d" % i for i in range(1, 14)) + b"," + b",".join(
    b"C%d" % i for i in range(1, 27)) + b"\n"


def csv_line(i=0, label=b"0"):
    return b"%d," % (10000000 + i) + criteo_line(label).replace(b"\t", b",")


def test_criteo_csv_header_checks(tmp_path):
    p = write(tmp_path, [CSV_HEADER.replace(b"I7", b"I77"), csv_line()])
    with pytest.raises(DataError, match=r":1: bad header: missing \['I7'\]; unexpected \['I77'\]"):
        CriteoCSVSource(p)
    p = write(tmp_path, [CSV_HEADER.replace(b"Label,", b""), csv_line()])
    with pytest.raises(DataError, match="no Label column.*Kaggle's test.csv"):
        CriteoCSVSource(p)
    p = write(tmp_path, [csv_line(), csv_line()])  # no header at all
    with pytest.raises(DataError, match="bad header"):
        CriteoCSVSource(p)


def test_criteo_csv_bad_label_and_crlf(tmp_path):
    p = write(tmp_path, [CSV_HEADER, csv_line().replace(b"\n", b"\r\n"), csv_line(1, b"-1")])
    with pytest.raises(DataError) as e:
        read(CriteoCSVSource(p))
    assert_error(e.value, p, 3, "Label", "bad label")  # header is line 1
    c = read(CriteoCSVSource(p, skip_bad_lines=True))
    assert c.size == 1 and c.row.tolist() == [0]  # CRLF line parsed, row 0 = first data line


# ----------------------------------------------------------------------------- avazu

AVAZU_HEADER = (b"id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,"
                b"app_domain,app_category,device_id,device_ip,device_model,device_type,"
                b"device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21\n")
AVAZU_LINE = (b"10000169349117863715,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,"
              b"7801e8d9,07d7df22,a99f214a,96809ac8,711ee120,1,0,15704,320,50,1722,0,35,100084,79\n")


@pytest.mark.parametrize("old,new,field,words", [
    (b",0,14102100", b",2,14102100", "click", ["bad label"]),
    (b"14102100", b"14102124", "hour", ["bad hour", "YYMMDDHH"]),
    (b"14102100", b"14023100", "hour", ["bad hour"]),  # 31 February
    (b"14102100", b"1410x100", "hour", ["not an integer"]),
    (b"1fbe01fe", b"1fbe\xff\xfe", "site_id", ["not UTF-8 text"]),
    (b",79\n", b"\n", "C21", ["field count", "got 23"]),
    (b",79\n", b",79 \n", "C21", ["whitespace around a category", "'79 '"]),  # issue 40 item 15
    (b",1fbe01fe,", b", 1fbe01fe,", "site_id", ["whitespace around a category"]),
])
def test_avazu_bad_lines(tmp_path, old, new, field, words):
    p = write(tmp_path, [AVAZU_HEADER, AVAZU_LINE, AVAZU_LINE.replace(old, new)])
    with pytest.raises(DataError) as e:
        read(AvazuSource(p))
    assert_error(e.value, p, 3, field, *words)
    src = AvazuSource(p, skip_bad_lines=True)
    assert read(src).size == 1 and sum(src.stats.skipped.values()) == 1


def test_avazu_header_mismatch_and_headerless(tmp_path):
    p = write(tmp_path, [AVAZU_HEADER.replace(b"C1,", b""), AVAZU_LINE])
    with pytest.raises(DataError, match=r"bad header: missing \['C1'\]"):
        AvazuSource(p)
    p = write(tmp_path, [AVAZU_LINE, AVAZU_LINE.replace(b",0,1410", b",x,1410")])
    with pytest.raises(DataError) as e:
        read(AvazuSource(p))
    assert_error(e.value, p, 2, "click", "bad label")  # no header: data starts at line 1


# ----------------------------------------------------------------------------- libFM / Frappe

FRAPPE_LINE = b"1 266:1 1244:1 5042:1 5049:1 5054:1 5055:1 5058:1 5062:1 5074:1 5149:1\r\n"


@pytest.mark.parametrize("old,new,field,words", [
    (b"1 266", b"2 266", "label", ["bad label", "-1"]),
    (b"1 266", b"yes 266", "label", ["bad label"]),
    (b" 5149:1", b"", "city", ["expected 11 whitespace-separated fields, got 10"]),
    (b"1244:1", b"1244:0.5", "item", ["feature value not 1"]),
    (b"1244:1", b"1244", "item", ["not idx:value"]),
    (b"5149:1", b"9999:1", "city", ["out of range", "5381"]),
    (b"5042:1", b"5x42:1", "daytime", ["not an integer"]),
    (b"5042:1", b"\xff\xfe:1", "daytime", ["not an integer", "\\xff"]),
])
def test_frappe_bad_lines(tmp_path, old, new, field, words):
    p = write(tmp_path, [FRAPPE_LINE, FRAPPE_LINE.replace(old, new), FRAPPE_LINE])
    with pytest.raises(DataError) as e:
        read(FrappeSource(p))
    assert_error(e.value, p, 2, field, *words)
    src = FrappeSource(p, skip_bad_lines=True)
    assert read(src).row.tolist() == [0, 2]


def test_frappe_labels(tmp_path):
    p = write(tmp_path, [FRAPPE_LINE, FRAPPE_LINE.replace(b"1 266", b"-1 266"),
                         FRAPPE_LINE.replace(b"1 266", b"+1 266")])
    assert read(FrappeSource(p)).label.tolist() == [1.0, 0.0, 1.0]


# ----------------------------------------------------------------------------- MovieLens


@pytest.mark.parametrize("bad,field,words", [
    (b"196\t242\t6\t881250949\n", "rating", ["rating out of range", "1..5"]),
    (b"196\t242\t3.5\t881250949\n", "rating", ["not an integer"]),
    (b"0\t242\t3\t881250949\n", "user_id", ["id out of range", "1..943"]),
    (b"196\t1683\t3\t881250949\n", "item_id", ["id out of range"]),
    (b"196\t\t3\t881250949\n", "item_id", ["missing value"]),
    (b"196\t242\t3\t-5\n", "timestamp", ["negative timestamp"]),
    (b"196 242 3 881250949\n", "item_id", ["field count"]),
])
def test_movielens_bad_lines(tmp_path, bad, field, words):
    p = write(tmp_path, [b"196\t242\t3\t881250949\n", bad], name="u.data")
    with pytest.raises(DataError) as e:
        read(MovieLensSource(p))
    assert_error(e.value, p, 2, field, *words)


# ----------------------------------------------------------------------------- Taobao

TAOBAO_HEADER = b",".join(c.encode() for c in TAOBAO_COLUMNS) + b"\n"
TAOBAO_LINE = b"0,2017-05-06 00:00:00,874257,172298,430548_1007,5443,160194,864,339907,3.9,0,3,2,3,,3,0,,170301^573514\n"  # noqa: E501


@pytest.mark.parametrize("old,new,field,words", [
    (b"170301^573514", b"170301^^573514", "click_sequence", ["empty id in sequence"]),
    (b"2017-05-06 00:00:00", b"2017-05-06", "time_stamp", ["bad time"]),
    (b",3.9,", b",nan,", "price", ["not a finite number"]),
    (b",3.9,", b",cheap,", "price", ["not a number"]),
    (b"874257", b"87\xff257", "userid", ["not UTF-8"]),
    (b"0,2017", b"3,2017", "clk", ["bad label"]),
    # issue 40 item 15: float() took these where the integer fields refuse them
    (b",3.9,", b",1_000,", "price", ["not a number", "no spaces, signs '+' or digit separators"]),
    (b",3.9,", b",+3.9,", "price", ["not a number"]),
    (b",3.9,", b", 3.9,", "price", ["not a number"]),
    (b",5443,", b",5443 ,", "cate_id", ["whitespace around a category"]),
])
def test_taobao_bad_lines(tmp_path, old, new, field, words):
    p = write(tmp_path, [TAOBAO_HEADER, TAOBAO_LINE.replace(old, new), TAOBAO_LINE])
    with pytest.raises(DataError) as e:
        read(TaobaoSource(p))
    assert_error(e.value, p, 2, field, *words)
    src = TaobaoSource(p, skip_bad_lines=True)
    c = read(src)
    assert c.row.tolist() == [1] and c.mask[0, -1].tolist()[:3] == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("cls,lines", [
    (MovieLensSource, [b"196\t242\t3\t881250949\n", b"196\t242\t3\t8812"]),
    (CriteoCSVSource, None),
])
def test_a_last_line_without_newline_is_reported(tmp_path, cls, lines):
    """Issue 40 item 15: a file cut inside its last field still parses (8812 is a timestamp
    too); a last line with no newline is read, and its number reported (ReadStats.unterminated,
    summary.json data_stats and warnings)."""
    if lines is None:
        header = b"Id,Label," + b",".join(b"I%d" % i for i in range(1, 14)) + b"," + b",".join(
            b"C%d" % i for i in range(1, 27)) + b"\n"
        line = b"7,1," + b",".join(b"%d" % i for i in range(1, 14)) + b"," + b",".join(
            [b"68fd1e64"] * 26)
        lines = [header, line + b"\n", line[:-3]]
    p = write(tmp_path, lines, name="cut.txt")
    src = cls(p)
    read(src)
    assert src.stats.unterminated == len(lines)
    assert src.stats.as_dict()["last_line_unterminated"] == len(lines)
    whole = write(tmp_path, [*lines[:-1], lines[-1] + b"\n"], name="whole.txt")
    src = cls(whole)
    read(src)
    assert src.stats.unterminated is None and "last_line_unterminated" not in src.stats.as_dict()


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-16-le"])
def test_a_utf16_file_is_named_as_such(tmp_path, encoding):
    """Issue 40 item 15: UTF-16 files were reported as having CR-only line endings."""
    p = tmp_path / "u16.data"
    p.write_bytes("196\t242\t3\t881250949\n186\t302\t3\t891717742\n".encode(encoding))
    with pytest.raises(DataError, match="UTF-16"):
        MovieLensSource(str(p))
