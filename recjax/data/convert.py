"""Text -> a converted Parquet dataset (`recjax.data.columnar`): validate once, read fast.

    python scripts/convert.py criteo:day_0.tsv criteo:day_1.tsv --out data/criteo_pq

Each input is read by its text reader, with its checks: a bad line stops the conversion with
``file:line: field X: ...`` as a run would, or with ``--skip-bad-lines`` is skipped and counted
(the counts, and the first few lines, go to the manifest and the report). The reader runs in
its conversion mode (`recjax.data.hashing.TokenCapture`): every token that would become an id is
kept as its crc32 and raw id instead, so hashing (any ``hash_buckets``) and raw ids stay the
run's choice. Each input becomes one file, ``part-NNNNN.parquet`` in the order given, its rows
continuing the previous input's (`row` counts data lines across the inputs). With ``split_on``
(``--split-on FIELD``, a field of exact ids) an input is cut into a new file wherever that
field's value changes: an Avazu log, in time order, becomes one file per day with
``--split-on weekday`` or per hour with ``--split-on hour_of_day``, and a file is a day of
``--data.order=time`` (`recjax.data.days`).

The output is written into a temporary folder beside ``--out`` and renamed into place when
every input is converted, so an interrupted conversion leaves no half dataset behind.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator

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
            compression: str = "snappy", split_on: str = "",
            log: Callable[[str], None] | None = None) -> dict:
    """Convert text inputs of one kind into a Parquet dataset at `out`.

    Args:
      specs: data specs of one kind and schema, e.g. ``["criteo:a.tsv", "criteo:b.tsv"]``.
      out: the folder to write; it must not exist, or be empty.
      rows_per_group: examples per Parquet row group (the last of a file may have fewer).
      skip_bad_lines: skip and count malformed lines instead of stopping at the first.
      multi_hot_len: ids a run may use per example of a multi-hot field (one more is kept, to
        mark the examples that had more: recjax/data/columnar.py).
      compression: Parquet codec of the pages.
      split_on: a field of exact ids (e.g. Avazu's ``weekday``): a new file wherever its value
        changes within an input (empty: one file per input).
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
        paths = (os.path.join(tmp, part_name(i)) for i in itertools.count())
        for spec in specs:
            t0 = time.perf_counter()
            recs, this, lines = _convert_one(spec, paths, first_row, rows_per_group,
                                             skip_bad_lines, multi_hot_len, compression,
                                             split_on, log)
            if layout is None:
                layout = this
            elif this != layout:
                raise DataError(spec, None, None, f"has another schema than {specs[0]} "
                                "(kind, fields or vocabularies differ)",
                                "Convert inputs of one kind and layout together")
            s = recs[-1]["read_stats"]  # the input's reader counters, on its last file
            for k, v in s["truncated_by_field"].items():
                truncated[k] = truncated.get(k, 0) + v
            first_row += lines
            files += recs
            if log:
                log(f"{spec}: {sum(r['rows'] for r in recs):,} rows in "
                    f"{sum(len(r['row_groups']) for r in recs)} row groups"
                    + (f" and {len(recs)} files" if len(recs) > 1 else "")
                    + f", {sum(r['bytes'] for r in recs) / 2**20:,.1f} MiB, "
                    f"{s['skipped_lines']} lines skipped, {time.perf_counter() - t0:.1f} s")
        manifest = {"format": FORMAT, "version": VERSION, "layout": layout.to_json(),
                    "rows": sum(f["rows"] for f in files), "truncated": truncated,
                    "conversion": {"rows_per_group": rows_per_group,
                                   "skip_bad_lines": skip_bad_lines, "compression": compression,
                                   "split_on": split_on},
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


def _convert_one(spec: str, paths: Iterator[str], first_row: int, rows_per_group: int,
                 skip_bad_lines: bool, multi_hot_len: int, compression: str, split_on: str,
                 log: Callable[[str], None] | None) -> tuple[list[dict], Layout, int]:
    """Write one input to the next of `paths` (a new one wherever `split_on` changes); the
    manifest records of its files, its layout, and its data lines (bad ones included)."""
    import pyarrow as pa

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
    out = _Files(spec, paths, rows_per_group, compression, first_row, log)
    layout, cut, split = None, {}, None
    try:
        for chunk in source.chunks():
            crc, raw = capture.take() if capture else (None, None)
            if layout is None:
                layout = _layout(source, capture, multi_hot_len)
                out.schema = _arrow_schema(layout, pa).with_metadata(
                    {FORMAT: json.dumps({"layout": layout.to_json()})})
                split = _split_field(layout, split_on, spec)
            table = _table(chunk, crc, raw, layout, first_row, out.schema, cut, pa)
            if split is None:
                out.add(table)
                continue
            value = chunk.ids[:, split, 0]
            cuts = [0, *(np.flatnonzero(value[1:] != value[:-1]) + 1), value.size]
            for a, b in zip(cuts[:-1], cuts[1:]):
                out.add(table.slice(a, b - a), key=int(value[a]))
        err = all_skipped_error(source.path, source.stats)
        if err is not None:
            raise err
        if out.writer is None and not out.recs:  # no rows at all: the readers raise before
            raise DataError(source.path, None, None, "no examples", "Check the file")
    finally:
        out.close()
    stats = source.stats.as_dict()
    stats["truncated_by_field"] = cut  # the reader counted examples longer than keep
    lines = source.stats.rows + sum(source.stats.skipped.values())
    for r in out.recs:  # the input's data lines and counters, on its last file
        last = r is out.recs[-1]
        r.update(lines=lines if last else None, read_stats=stats if last else None)
    return out.recs, layout, lines


class _Files:
    """The Parquet files of one input: row groups of `rows_per_group` rows, a new file when
    `add` is given another `key` than the rows before (`split_on`)."""

    def __init__(self, spec: str, paths: Iterator[str], rows_per_group: int, compression: str,
                 first_row: int, log: Callable[[str], None] | None):
        self.spec, self.paths, self.rows_per_group = spec, paths, rows_per_group
        self.compression, self.log = compression, log
        self.schema, self.writer, self.path, self.key = None, None, None, None
        self.pending, self.n_pending, self.groups = [], 0, []
        self.first = first_row  # the input's first row; a split file's first example's row
        self.recs: list[dict] = []

    def add(self, table, key: int | None = None) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not table.num_rows:
            return
        if self.writer is not None and key != self.key:
            self.close()
        if self.writer is None:
            if self.recs:
                self.first = int(table.column("row")[0].as_py())
            self.path, self.key = next(self.paths), key
            self.writer = pq.ParquetWriter(self.path, self.schema, compression=self.compression,
                                           write_page_checksum=True)
        self.pending.append(table)
        self.n_pending += table.num_rows
        g = self.rows_per_group
        while self.n_pending >= g:
            joined = pa.concat_tables(self.pending)
            self.writer.write_table(joined.slice(0, g), row_group_size=g)
            self.groups.append(g)
            if self.log and len(self.groups) % 32 == 0:
                self.log(f"  {self.spec}: {sum(self.groups):,} rows written")
            rest = joined.slice(g)
            self.pending, self.n_pending = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self) -> None:
        """Write what is pending and close the file (its record goes to `recs`)."""
        import pyarrow as pa

        if self.writer is None:
            return
        try:
            if self.n_pending:
                self.writer.write_table(pa.concat_tables(self.pending),
                                        row_group_size=self.rows_per_group)
                self.groups.append(self.n_pending)
        finally:
            self.writer.close()
        rec = {"name": os.path.basename(self.path), "input": self.spec,
               "bytes": os.path.getsize(self.path), "rows": sum(self.groups),
               "first_row": self.first, "row_groups": self.groups}
        if self.key is not None:
            rec["split_value"] = self.key
        self.recs.append(rec)
        self.writer, self.pending, self.n_pending, self.groups = None, [], 0, []


def _split_field(layout: Layout, name: str, spec: str) -> int | None:
    """The index of the field `split_on` names (None: no split); it must hold exact ids."""
    if not name:
        return None
    exact = [f.name for f in layout.fields if f.form == "exact" and not f.multi_hot]
    if name not in exact:
        raise ValueError(f"{spec}: --split-on {name}: not a field of exact ids of this kind; "
                         f"these are: {', '.join(exact) or 'none'} (e.g. avazu: weekday for "
                         "one file per day, hour_of_day for one per hour)")
    return [f.name for f in layout.fields].index(name)


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
