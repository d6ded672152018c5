"""Text -> a converted Parquet dataset (`recjax.data.columnar`): validate once, read fast.

    python scripts/convert.py criteo:day_0.tsv criteo:day_1.tsv --out data/criteo_pq

Each input is read by its text reader, with its checks: a bad line stops the conversion with
``file:line: field X: ...`` as a run would, or with ``--skip-bad-lines`` is skipped and counted
(the counts, and the first few lines, go to the manifest and the report). The reader runs in
its conversion mode (`recjax.data.hashing.TokenCapture`): every token that would become an id is
kept as its crc32 and raw id instead, so hashing (any ``hash_buckets``) and raw ids stay the
run's choice. Each input becomes one file, ``part-NNNNN.parquet`` in the order given, its rows
continuing the previous input's (`row` counts data lines across the inputs).

The output is written into a temporary folder beside ``--out`` and renamed into place when
every input is converted, so an interrupted conversion leaves no half dataset behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np

from recjax.batch import Chunk
from recjax.data.base import DataError, all_skipped_error
from recjax.data.columnar import FORMAT, MANIFEST, VERSION, Layout, StoredField, part_name
from recjax.data.hashing import CategoricalIds, TokenCapture
from recjax.data.readers import TextSource
from recjax.data.sources import open_source

ROWS_PER_GROUP = 1 << 17  # 131,072: ~25 MB of Criteo columns; two default chunks of a run
MULTI_HOT_LEN = 100  # ids kept per multi-hot example (runs use <= this; the default is 20)
_CHUNK_BYTES = 1 << 28  # bound on a reader chunk's ids + mask while converting


def convert(specs: list[str], out: str, *, rows_per_group: int = ROWS_PER_GROUP,
            skip_bad_lines: bool = False, multi_hot_len: int = MULTI_HOT_LEN,
            compression: str = "snappy", log: Callable[[str], None] | None = None) -> dict:
    """Convert text inputs of one kind into a Parquet dataset at `out`.

    Args:
      specs: data specs of one kind and schema, e.g. ``["criteo:a.tsv", "criteo:b.tsv"]``.
      out: the folder to write; it must not exist, or be empty.
      rows_per_group: examples per Parquet row group (the last of a file may have fewer).
      skip_bad_lines: skip and count malformed lines instead of stopping at the first.
      multi_hot_len: ids a run may use per example of a multi-hot field (one more is kept, to
        mark the examples that had more: recjax/data/columnar.py).
      compression: Parquet codec of the pages.
      log: called with a line per converted input.

    Returns:
      The manifest (also written to ``out/manifest.json``).

    Raises:
      DataError: a bad line (without `skip_bad_lines`), an input whose every line was bad, or
        inputs of different schemas.
      ValueError: bad arguments, or `out` is not empty.
    """

    if not specs:
        raise ValueError("give at least one input, e.g. criteo:PATH")
    if rows_per_group < 1 or multi_hot_len < 2:
        raise ValueError(f"rows_per_group must be >= 1 and multi_hot_len >= 2, got "
                         f"{rows_per_group} and {multi_hot_len}")
    out = os.path.abspath(out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"--out {out} exists and is not an empty folder; choose a new one or "
                         "remove it")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(out), prefix=f".{os.path.basename(out)}.partial-")
    try:
        files, layout, first_row, truncated = [], None, 0, {}
        for i, spec in enumerate(specs):
            t0 = time.perf_counter()
            rec, this = _convert_one(spec, os.path.join(tmp, part_name(i)), first_row,
                                     rows_per_group, skip_bad_lines, multi_hot_len, compression,
                                     log)
            if layout is None:
                layout = this
            elif this != layout:
                raise DataError(spec, None, None, f"has another schema than {specs[0]} "
                                "(kind, fields or vocabularies differ)",
                                "Convert inputs of one kind and layout together")
            for k, v in rec["read_stats"]["truncated_by_field"].items():
                truncated[k] = truncated.get(k, 0) + v
            first_row += rec["lines"]
            files.append(rec)
            if log:
                s = rec["read_stats"]
                log(f"{spec}: {rec['rows']:,} rows in {len(rec['row_groups'])} row groups, "
                    f"{rec['bytes'] / 2**20:,.1f} MiB, {s['skipped_lines']} lines skipped, "
                    f"{time.perf_counter() - t0:.1f} s")
        manifest = {"format": FORMAT, "version": VERSION, "layout": layout.to_json(),
                    "rows": sum(f["rows"] for f in files), "truncated": truncated,
                    "conversion": {"rows_per_group": rows_per_group,
                                   "skip_bad_lines": skip_bad_lines, "compression": compression},
                    "files": files}
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's folder is private (0700)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.rename(tmp, out)
        return manifest
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _convert_one(spec: str, path: str, first_row: int, rows_per_group: int,
                 skip_bad_lines: bool, multi_hot_len: int, compression: str,
                 log: Callable[[str], None] | None) -> tuple[dict, Layout]:
    """Write one input to `path`; its manifest record and its layout."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # One id more than a run may use: a list of multi_hot_len + 1 ids marks an example that
    # had more, so a run counts truncated examples exactly, as the text reader does.
    keep = multi_hot_len + 1
    probe = open_source(spec, raw_ids=True, multi_hot_len=keep)
    if not isinstance(probe, TextSource):
        raise ValueError(f"{spec}: the converter reads text (criteo:, criteo-csv:, avazu:, frappe:, "
                         "movielens:, taobao:), not this kind")
    per_row = probe.spec.n_fields * probe.spec.max_len * 12  # i64 ids + f32 mask
    chunk_rows = max(4096, min(rows_per_group, _CHUNK_BYTES // max(per_row, 1)))
    source = open_source(spec, raw_ids=True, multi_hot_len=keep, chunk_rows=chunk_rows,
                         skip_bad_lines=skip_bad_lines)
    capture = TokenCapture() if isinstance(source, CategoricalIds) else None
    source.capture = capture
    writer, pending, n_pending, groups, layout, cut = None, [], 0, [], None, {}
    try:
        for chunk in source.chunks():
            crc, raw = capture.take() if capture else (None, None)
            if layout is None:
                layout = _layout(source, capture, multi_hot_len)
                schema = _arrow_schema(layout, pa).with_metadata(
                    {FORMAT: json.dumps({"layout": layout.to_json()})})
                writer = pq.ParquetWriter(path, schema, compression=compression,
                                          write_page_checksum=True)
            pending.append(_table(chunk, crc, raw, layout, first_row, schema, cut, pa))
            n_pending += chunk.size
            while n_pending >= rows_per_group:
                table = pa.concat_tables(pending)
                writer.write_table(table.slice(0, rows_per_group), row_group_size=rows_per_group)
                groups.append(rows_per_group)
                if log and len(groups) % 32 == 0:
                    log(f"  {spec}: {sum(groups):,} rows written")
                rest = table.slice(rows_per_group)
                pending, n_pending = ([rest] if rest.num_rows else []), rest.num_rows
        err = all_skipped_error(source.path, source.stats)
        if err is not None:
            raise err
        if writer is None:  # no rows at all: the readers raise before that; keep it explicit
            raise DataError(source.path, None, None, "no examples", "Check the file")
        if n_pending:
            writer.write_table(pa.concat_tables(pending), row_group_size=rows_per_group)
            groups.append(n_pending)
    finally:
        if writer is not None:
            writer.close()
    stats = source.stats.as_dict()
    stats["truncated_by_field"] = cut  # the reader counted examples longer than keep
    rec = {"name": os.path.basename(path), "input": spec, "bytes": os.path.getsize(path),
           "rows": sum(groups), "first_row": first_row,
           "lines": source.stats.rows + sum(source.stats.skipped.values()),
           "row_groups": groups, "read_stats": stats}
    return rec, layout


def _layout(source, capture: TokenCapture | None, multi_hot_len: int) -> Layout:
    """The layout of a reader's chunks: which fields went through the token funnel."""
    salts = capture.salts if capture else {}
    fields = []
    for f in source.spec.fields:
        multi = f.max_len > 1
        if f.name in salts:
            fields.append(StoredField(f.name, f.table, f.pooling, "tokens", salt=salts[f.name],
                                      multi_hot=multi))
        elif multi:
            raise ValueError(f"{source.name}: multi-hot field {f.name!r} of exact ids; the "
                             "columnar format stores multi-hot fields of tokens only")
        else:
            fields.append(StoredField(f.name, f.table, f.pooling, "exact",
                                      vocab_size=f.vocab_size))
    return Layout(kind=source.name.split(":", 1)[0], dense_names=tuple(source.spec.dense_names),
                  fields=tuple(fields), multi_hot_len=multi_hot_len if source.spec.multi_hot
                  else 1)


def _arrow_schema(layout: Layout, pa):
    cols = [("row", pa.int64()), ("label", pa.float32())]
    cols += [(f"dense:{n}", pa.float32()) for n in layout.dense_names]
    for f in layout.fields:
        if f.form == "exact":
            cols.append((f"id:{f.name}", pa.int32()))
        else:
            crc, raw = pa.uint32(), pa.int64()
            if f.multi_hot:
                crc, raw = pa.list_(crc), pa.list_(raw)
            cols += [(f"crc:{f.name}", crc), (f"raw:{f.name}", raw)]
    return pa.schema([pa.field(n, t, nullable=False) for n, t in cols])


def _table(chunk: Chunk, crc, raw, layout: Layout, first_row: int, schema, cut: dict, pa):
    """A reader's chunk (tokens as capture indices) as a table of the stored columns; adds the
    examples whose multi-hot fields have more than ``layout.multi_hot_len`` ids to `cut`."""
    cols = [pa.array(chunk.row + first_row), pa.array(chunk.label)]
    cols += [pa.array(np.ascontiguousarray(chunk.dense[:, j]))
             for j in range(len(layout.dense_names))]
    for k, f in enumerate(layout.fields):
        if f.form == "exact":
            cols.append(pa.array(chunk.ids[:, k, 0].astype(np.int32)))
            if chunk.mask is not None and not (chunk.mask[:, k, 0] == 1).all():
                raise ValueError(f"field {f.name!r}: one-hot mask not 1; cannot be stored")
            continue
        if not f.multi_hot:
            idx = chunk.ids[:, k, 0]
            cols += [pa.array(crc[idx]), pa.array(raw[idx])]
            continue
        m = chunk.mask[:, k, :] > 0
        lengths = m.sum(axis=1)
        cut[f.name] = cut.get(f.name, 0) + int(np.count_nonzero(lengths > layout.multi_hot_len))
        if not (m == (np.arange(m.shape[1]) < lengths[:, None])).all():
            raise ValueError(f"field {f.name!r}: the mask is not a prefix; cannot be stored")
        idx = chunk.ids[:, k, :][m]  # row-major: each example's ids in order
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        cols += [pa.ListArray.from_arrays(offsets, pa.array(crc[idx])),
                 pa.ListArray.from_arrays(offsets, pa.array(raw[idx]))]
    return pa.Table.from_arrays(cols, schema=schema)
