"""Issue 16, item 11: the readers' messages for a BOM, CR-only line endings and a file whose
every line was skipped."""

import dataclasses

import pytest

from recjax.batch import concat_chunks
from recjax.config import Config, DataConfig
from recjax.data.avazu import AvazuSource
from recjax.data.base import DataError
from recjax.data.criteo import CriteoSource
from recjax.data.libfm import FrappeSource
from recjax.data.movielens import MovieLensSource
from recjax.data.pipeline import cached
from recjax.data.sources import open_source
from recjax.data.taobao import COLUMNS as TAOBAO_COLUMNS
from recjax.data.taobao import TaobaoSource
from recjax.train.data import open_data

BOM = b"\xef\xbb\xbf"
AVAZU_HEADER = (b"id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,"
                b"app_domain,app_category,device_id,device_ip,device_model,device_type,"
                b"device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21\n")
AVAZU_LINE = (b"10000169349117863715,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,"
              b"7801e8d9,07d7df22,a99f214a,96809ac8,711ee120,1,0,15704,320,50,1722,0,35,100084,79\n")
TAOBAO_HEADER = b",".join(c.encode() for c in TAOBAO_COLUMNS) + b"\n"
TAOBAO_LINE = (b"0,2017-05-06 00:00:00,874257,172298,430548_1007,5443,160194,864,339907,3.9,0,3,"
               b"2,3,,3,0,,170301^573514\n")
MOVIELENS_LINE = b"196\t242\t3\t881250949\n"
CRITEO_LINE = b"\t".join([b"0", *[b"%d" % i for i in range(13)],
                          *[b"%08x" % (i * 7919) for i in range(26)]]) + b"\n"
FRAPPE_LINE = b"1 266:1 1244:1 5042:1 5049:1 5054:1 5055:1 5058:1 5062:1 5074:1 5149:1\r\n"


def write(tmp_path, data: bytes, name="data.txt"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def read(source):
    return concat_chunks(list(source.chunks()))


# ----------------------------------------------------------------------------- item 12: NUL


@pytest.mark.parametrize("make,lines,old,field", [
    (AvazuSource, [AVAZU_HEADER, AVAZU_LINE], b"1fbe01fe", "site_id"),
    (AvazuSource, [AVAZU_HEADER, AVAZU_LINE], b",79\n", "C21"),
    (TaobaoSource, [TAOBAO_HEADER, TAOBAO_LINE], b"874257", "userid"),
    (TaobaoSource, [TAOBAO_HEADER, TAOBAO_LINE], b"170301^", "click_sequence"),
    (CriteoSource, [CRITEO_LINE], b"00001eef", "C2"),
    (FrappeSource, [FRAPPE_LINE], b"1244:1", "item"),
    (MovieLensSource, [MOVIELENS_LINE], b"242", "item_id"),
], ids=["avazu-site_id", "avazu-C21", "taobao-userid", "taobao-sequence", "criteo", "frappe",
        "movielens"])
def test_nul_byte_in_a_field_is_a_bad_line(tmp_path, make, lines, old, field):
    """A NUL byte hashed as part of a category was a silent wrong value (Avazu, Taobao)."""
    good = lines[-1]
    assert old in good
    new = old[:1] + b"\x00" + old[1:]
    p = write(tmp_path, b"".join([*lines, good.replace(old, new), good]), name="u.data")
    bad_line = len(lines) + 1
    with pytest.raises(DataError) as e:
        read(make(p))
    msg = str(e.value)
    assert msg.startswith(f"{p}:{bad_line}: field {field!r}: "), msg
    assert "\\x00" in msg and "--skip-bad-lines" in msg, msg
    src = make(p, skip_bad_lines=True)
    c = read(src)
    assert c.size == 2 and sum(src.stats.skipped.values()) == 1
    assert f"{p}:{bad_line}:" in src.stats.first_skipped[0]


def test_nul_byte_in_avazu_text_field_names_the_problem(tmp_path):
    p = write(tmp_path, AVAZU_HEADER + AVAZU_LINE.replace(b"1fbe01fe", b"1fbe\x0001fe"))
    with pytest.raises(DataError, match=r":2: field 'site_id': NUL byte.*corrupt or binary"):
        read(AvazuSource(p))
    src = AvazuSource(p, skip_bad_lines=True)
    assert list(src.chunks()) == [] and src.stats.skipped == {"NUL byte": 1}


# ----------------------------------------------------------------------------- item 11a: BOM


def test_utf8_bom_before_avazu_header_is_recognised(tmp_path):
    p = write(tmp_path, BOM + AVAZU_HEADER + AVAZU_LINE + AVAZU_LINE)
    src = AvazuSource(p)
    assert src.has_header
    c = read(src)
    assert c.size == 2 and c.row.tolist() == [0, 1]
    plain = read(AvazuSource(write(tmp_path, AVAZU_HEADER + AVAZU_LINE * 2, name="plain.csv")))
    assert (c.ids == plain.ids).all() and (c.label == plain.label).all()


def test_utf8_bom_before_required_header_and_headerless_data(tmp_path):
    assert read(TaobaoSource(write(tmp_path, BOM + TAOBAO_HEADER + TAOBAO_LINE))).size == 1
    c = read(CriteoSource(write(tmp_path, BOM + CRITEO_LINE * 2, name="c.tsv")))
    plain = read(CriteoSource(write(tmp_path, CRITEO_LINE * 2, name="p.tsv")))
    assert (c.ids == plain.ids).all() and (c.dense == plain.dense).all()


def test_utf8_bom_in_a_headerless_avazu_file_keeps_line_numbers(tmp_path):
    p = write(tmp_path, BOM + AVAZU_LINE + AVAZU_LINE.replace(b",0,1410", b",x,1410"))
    with pytest.raises(DataError, match=rf"^{p}:2: field 'click': bad label"):
        read(AvazuSource(p))


# ----------------------------------------------------------------------------- item 11b: CR


@pytest.mark.parametrize("make,data", [
    (AvazuSource, AVAZU_HEADER + AVAZU_LINE * 2000),
    (AvazuSource, AVAZU_LINE * 2000),
    (TaobaoSource, TAOBAO_HEADER + TAOBAO_LINE * 2000),
    (CriteoSource, CRITEO_LINE * 2000),
    (FrappeSource, FRAPPE_LINE.replace(b"\r\n", b"\n") * 2000),
], ids=["avazu", "avazu-headerless", "taobao", "criteo", "frappe"])
def test_cr_only_line_endings_give_a_short_message(tmp_path, make, data):
    p = write(tmp_path, data.replace(b"\n", b"\r"))
    with pytest.raises(DataError) as e:
        read(make(p))
    msg = str(e.value)
    assert len(msg) < 300 + len(str(p)), (len(msg), msg[:500])
    assert msg.startswith(f"{p}:") and "CR-only line endings" in msg, msg
    assert "tr '\\r' '\\n'" in msg, msg


def test_crlf_still_reads(tmp_path):
    p = write(tmp_path, (AVAZU_HEADER + AVAZU_LINE * 3).replace(b"\n", b"\r\n"))
    assert read(AvazuSource(p)).size == 3


def test_long_bad_header_is_not_listed_in_full(tmp_path):
    header = b"id,click," + b",".join(b"col%d" % i for i in range(5000)) + b"\n"
    p = write(tmp_path, header + AVAZU_LINE)
    with pytest.raises(DataError, match="bad header") as e:
        AvazuSource(p)
    assert len(str(e.value)) < 600 and "more" in str(e.value), str(e.value)[:700]


# ----------------------------------------------------------------------------- item 11c


def bad_criteo(tmp_path, n=7):
    lines = [CRITEO_LINE.replace(b"0\t", b"7\t", 1)] * (n - 2) + [b"x\ty\n", b"\n"]
    return write(tmp_path, b"".join(lines))


def test_every_line_skipped_is_named_not_batch_size(tmp_path):
    p = bad_criteo(tmp_path)
    src = cached(open_source(f"criteo:{p}", skip_bad_lines=True))
    with pytest.raises(DataError) as e:
        list(src.chunks())
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and "every line was skipped as malformed" in msg, msg
    assert "7 lines" in msg and "bad label: 5" in msg and "field count: 2" in msg, msg
    assert f"{p}:1" in msg and "lines 1, 2, 3" in msg, msg  # the first locations
    assert "batch-size" not in msg, msg


def test_every_line_skipped_in_a_run(tmp_path):
    """Through the trainer's data setup, where the message used to be 'lower --batch-size'."""
    p = bad_criteo(tmp_path)
    cfg = dataclasses.replace(Config(), data=DataConfig(train=f"criteo:{p}", skip_bad_lines=True))
    with pytest.raises(DataError) as e:
        open_data(cfg)
    msg = str(e.value)
    assert "every line was skipped" in msg and "batch-size" not in msg, msg


def test_some_lines_skipped_still_reads(tmp_path):
    p = write(tmp_path, CRITEO_LINE + b"\n" + CRITEO_LINE)
    src = cached(open_source(f"criteo:{p}", skip_bad_lines=True))
    assert sum(c.size for c in src.chunks()) == 2 and sum(c.size for c in src.chunks()) == 2
