"""Input throughput: text and Parquet to batches, against pyarrow's own readers.

    python scripts/bench_data.py [--rows 5004000] [--repeats 5] [--workdir DIR] [--out FILE]
    python scripts/bench.py --sections data          # the same, as a section of the bench

One run, on a Criteo-shaped TSV of ``--rows`` rows that it generates (1.2 GB for 5M rows, kept
in ``--workdir``, by default under the system's temporary folder, for the next run): the rows of
../shared/data/criteo_kaggle_8k/train.tsv repeated, every categorical token perturbed by a Zipf
draw scaled to Criteo Kaggle's per-field cardinalities, so the file has Criteo's columns,
missing values and a realistic number of distinct tokens per row group. It is converted once
(`recjax.data.convert`, timed). Then, repeat by repeat, interleaved, each measured in wall
seconds and in this process's CPU seconds:

(a) ``parquet``: ``--data parquet:DIR`` to hashed, fixed-shape batches (B = 4096, 2**17
    buckets, file order; hashed by the compiled loop, and by numpy as without numba) and to
    raw-id batches, against a plain ``pyarrow.parquet`` read of the same columns into numpy
    arrays (one thread: ``use_threads=False``, as the reader), and against the *layout floor*:
    that read with the reader's page checksum verification, its ids stored ``[N, F, 1]`` as a
    batch holds them (no hashing);
(b) ``text``: the text reader (``criteo:PATH``) to the same batches, against
    ``pyarrow.csv.read_csv`` of the same file into one table (all 40 columns; one thread, and
    pyarrow's default threads), and against ``open_csv`` streaming it batch by batch (one
    thread; nothing kept, as the reader keeps nothing). Text passes read the first
    ``--text-rows`` rows (default all), so a slow reader can be measured in minutes.

After one untimed pass of each (imports, page cache), ratios are medians of per-repeat ratios
(each against the same repeat's reference). The box is shared: rates move with its load
(printed before and after); the CPU-second rates move less. Pin it to one core for one-core
rates: ``taskset -c 1 python scripts/bench_data.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import tempfile
import time

import numpy as np

from recjax.data.pipeline import batches
from recjax.data.sources import DEFAULT_DATA, open_source
from recjax.runlog import write_json_atomic

# Criteo Kaggle's distinct tokens per field (C1..C26, from the DLRM recipe), 45.8M rows.
KAGGLE_CARD = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
               27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
KAGGLE_ROWS = 45_840_617
SAMPLE = os.path.join("criteo_kaggle_8k", "train.tsv")
BATCH, BUCKETS = 4096, 1 << 17
WORKDIR = os.path.join(tempfile.gettempdir(), "recjax_bench_data")


def generate(path: str, rows: int, seed: int = 0) -> None:
    """Write a Criteo TSV of `rows` rows (module docstring): the sample's lines in turn, each
    non-empty C token replaced by ``(value + z * 0x9E3779B1) mod 2**32`` with ``z`` a Zipf(1.1)
    draw below the field's cardinality scaled to `rows` (z = 0, the original token, most often).
    Every token keeps its 8 hex digits, so lines keep their bytes' positions and the file is
    written by overwriting slots of the repeated sample, block by block."""
    src = os.path.join(os.environ.get("RECJAX_DATA") or DEFAULT_DATA, SAMPLE)
    if os.path.exists(src):
        with open(src, "rb") as f:
            base = f.read()
    else:  # a host without the shared samples (the lent GPU machine)
        base = synthetic_sample(8192, seed)
    lines = base.split(b"\n")[:-1]
    offsets, fields, values = [], [], []
    pos = 0
    for line in lines:
        cols = line.split(b"\t")
        p = pos + sum(len(c) + 1 for c in cols[:14])
        for k, c in enumerate(cols[14:]):
            if c:
                offsets.append(p)
                fields.append(k)
                values.append(int(c, 16))
            p += len(c) + 1
        pos += len(line) + 1
    offsets = np.array(offsets, np.int64)
    fields = np.array(fields, np.int64)
    values = np.array(values, np.uint64)
    card = np.maximum(1, (np.array(KAGGLE_CARD) * rows / KAGGLE_ROWS).astype(np.int64))[fields]
    hexdigits = np.frombuffer(b"0123456789abcdef", np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    rng = np.random.default_rng(seed)
    per = len(lines)
    copies = -(-rows // per)
    block = 8
    base_arr = np.frombuffer(base, np.uint8)
    with open(path + ".partial", "wb") as out:
        for c0 in range(0, copies, block):
            c1 = min(copies, c0 + block)
            buf = np.tile(base_arr, c1 - c0)
            z = (rng.zipf(1.1, size=(c1 - c0, offsets.size)) - 1) % card
            new = (values + z.astype(np.uint64) * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF)
            digits = hexdigits[((new[..., None] >> shifts) & np.uint64(15)).astype(np.intp)]
            at = (offsets + len(base) * np.arange(c1 - c0)[:, None])[..., None] + np.arange(8)
            buf[at.reshape(-1)] = digits.reshape(-1)
            if c1 * per > rows:  # the last block: only the rows asked for
                buf = buf[: len(base) * (c1 - c0 - 1)
                          + sum(len(ln) + 1 for ln in lines[: rows - (c1 - 1) * per])]
            out.write(buf.tobytes())
    os.replace(path + ".partial", path)


def synthetic_sample(lines: int, seed: int = 0) -> bytes:
    """Criteo-shaped TSV lines made up, for `generate` where the 8k sample is absent: label
    Bernoulli(0.25); I1..I13 empty 20% of the time, else ``floor(lognormal(1, 1.5))``;
    C1..C26 empty 10% of the time, else one of 64 fixed 8-hex-digit tokens per field."""
    rng = np.random.default_rng([seed, 5])
    pool = rng.integers(0, 1 << 32, (26, 64), dtype=np.uint64)
    label = (rng.random(lines) < 0.25).astype(int)
    ints = np.floor(rng.lognormal(1.0, 1.5, (lines, 13))).astype(np.int64)
    int_empty = rng.random((lines, 13)) < 0.2
    tok = pool[np.arange(26), rng.zipf(1.3, (lines, 26)) % 64]
    tok_empty = rng.random((lines, 26)) < 0.1
    out = []
    for i in range(lines):
        cols = [str(label[i])]
        cols += ["" if int_empty[i, j] else str(ints[i, j]) for j in range(13)]
        cols += ["" if tok_empty[i, j] else f"{int(tok[i, j]):08x}" for j in range(26)]
        out.append("\t".join(cols))
    return ("\n".join(out) + "\n").encode()


def _timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _drain(source) -> int:
    n = 0
    for b, _ in batches(source, BATCH, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True):
        n += b.label.shape[0]
    return n


def _plain_parquet(directory: str, columns: list[str], floor: bool = False) -> int:
    """Rows of a plain read of `columns` into numpy. ``floor``: as the reader reads them (page
    checksums verified) and with the ids stored where a batch holds them (`_layout_floor`)."""
    import pyarrow.parquet as pq

    n = 0
    for name in sorted(os.listdir(directory)):
        if name.endswith(".parquet"):
            f = pq.ParquetFile(os.path.join(directory, name), page_checksum_verification=floor)
            for g in range(f.num_row_groups):
                t = f.read_row_group(g, columns=columns, use_threads=False)
                cols = [c.to_numpy() for c in t.columns]
                if floor:
                    _layout_floor(t.column_names, cols)
                n += t.num_rows
    return n


def _layout_floor(names: list[str], cols: list[np.ndarray]) -> np.ndarray:
    """The categorical columns stored as a batch holds ids, ``[N, F, 1]`` (each column a
    strided store, no hashing): the transposed store that any reader of field-major files into
    the batch contract (DESIGN.md section 3) makes. Measured apart, numba loops of every tiling
    store 0.86-0.98 ns an id this way on the 2-core box, against 0.14 for a contiguous copy
    (docs/performance.md)."""
    cat = [c for k, c in zip(names, cols) if k.startswith(("crc:", "raw:"))]
    out = np.empty((cat[0].size, len(cat), 1), cat[0].dtype)
    for f, c in enumerate(cat):
        out[:, f, 0] = c
    return out


def _numpy_hashing(fn):
    """fn() with the columnar reader hashing by numpy (`hash_keys(compiled=False)`), as it does
    where numba is not installed."""
    from unittest import mock

    from recjax.data import columnar, hashing

    with mock.patch.object(columnar, "hash_keys",
                           functools.partial(hashing.hash_keys, compiled=False)):
        return fn()


def _read_csv(path: str, threads: bool, stream: bool = False) -> int:
    """Rows of `path` read by pyarrow's CSV reader: a whole table (`read_csv`), or batch by
    batch (`open_csv`, none kept), labels and I* inferred as integers, C* as strings."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    opts = pcsv.ReadOptions(column_names=names, use_threads=threads, block_size=1 << 24)
    parse = pcsv.ParseOptions(delimiter="\t")
    conv = pcsv.ConvertOptions(column_types={f"C{i}": pa.string() for i in range(1, 27)})
    if not stream:
        return pcsv.read_csv(path, opts, parse, conv).num_rows
    n = 0
    with pcsv.open_csv(path, opts, parse, conv) as reader:
        for b in reader:
            n += b.num_rows
    return n


def _head(path: str, rows: int) -> str:
    """The first `rows` lines of `path`, as a file beside it (made once)."""
    head = f"{path}.head{rows}"
    if not os.path.exists(head):
        with open(path, "rb") as f, open(head + ".partial", "wb") as out:
            for i, line in enumerate(f):
                if i == rows:
                    break
                out.write(line)
        os.replace(head + ".partial", head)
    return head


def bench_data(repeats: int, quick: bool, *, rows: int | None = None, workdir: str | None = None,
               text_rows: int | None = None) -> list[dict]:
    """The rows of the measurements (module docstring); ``quick``: 504,000 rows."""
    from recjax.data.convert import convert

    rows = rows or (504_000 if quick else 5_004_000)
    workdir = workdir or WORKDIR
    os.makedirs(workdir, exist_ok=True)
    tsv = os.path.join(workdir, f"criteo_{rows}.tsv")
    if not os.path.exists(tsv):
        t = time.perf_counter()
        generate(tsv, rows)
        print(f"  generated {tsv} ({os.path.getsize(tsv) / 2**30:.2f} GiB) in "
              f"{time.perf_counter() - t:.0f} s")
    pq_dir = os.path.join(workdir, f"criteo_{rows}.parquet")
    convert_rate = None
    if not os.path.exists(os.path.join(pq_dir, "manifest.json")):
        shutil.rmtree(pq_dir, ignore_errors=True)
        wall, cpu = _timed(lambda: convert([f"criteo:{tsv}"], pq_dir))
        convert_rate = {"wall": rows / wall, "cpu": rows / cpu}
        print(f"  converted in {wall:.0f} s ({rows / wall:,.0f} rows/s)")
    text_path = tsv if not text_rows or text_rows >= rows else _head(tsv, text_rows)
    text_n = min(rows, text_rows or rows)
    with open(os.path.join(pq_dir, "manifest.json")) as f:
        layout = json.load(f)["layout"]
    dense = [f"dense:{n}" for n in layout["dense_names"]]
    cols = {kind: ["row", "label", *dense, *(f"{kind}:{f['name']}" for f in layout["fields"])]
            for kind in ("crc", "raw")}
    runs = {
        "parquet -> hashed batches": lambda: _drain(open_source(f"parquet:{pq_dir}",
                                                                 hash_buckets=BUCKETS)),
        "pyarrow.parquet read, same columns (crc)": lambda: _plain_parquet(pq_dir, cols["crc"]),
        "the same read with page checksums, ids stored [N, F] (the layout floor)":
            lambda: _plain_parquet(pq_dir, cols["crc"], floor=True),
        "parquet -> hashed batches, numpy hashing": lambda: _numpy_hashing(
            lambda: _drain(open_source(f"parquet:{pq_dir}", hash_buckets=BUCKETS))),
        "parquet -> raw-id batches": lambda: _drain(open_source(f"parquet:{pq_dir}",
                                                                 raw_ids=True)),
        "pyarrow.parquet read, same columns (raw)": lambda: _plain_parquet(pq_dir, cols["raw"]),
        "text -> hashed batches": lambda: _drain(open_source(f"criteo:{text_path}",
                                                              hash_buckets=BUCKETS)),
        "pyarrow.csv.read_csv, 1 thread": lambda: _read_csv(text_path, False),
        "pyarrow.csv.read_csv, default threads": lambda: _read_csv(text_path, True),
        "pyarrow.csv.open_csv (streamed), 1 thread": lambda: _read_csv(text_path, False, True),
    }
    n_rows = {k: (text_n if k.startswith(("text", "pyarrow.csv")) else rows) for k in runs}
    for fn in runs.values():  # warm-up: imports, the files into the page cache
        fn()
    wall = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    for r in range(repeats):
        for k, fn in runs.items():
            w, c = _timed(fn)
            wall[k].append(n_rows[k] / w)
            cpu[k].append(n_rows[k] / c)
        print(f"  repeat {r + 1}/{repeats}: " + ", ".join(
            f"{k.split(',')[0].split(' ->')[0]} {wall[k][-1] / 1e3:,.0f}K" for k in runs))
    floor = {"parquet -> hashed batches":
             "the same read with page checksums, ids stored [N, F] (the layout floor)"}
    refs = {"parquet -> hashed batches": "pyarrow.parquet read, same columns (crc)",
            "parquet -> hashed batches, numpy hashing": "pyarrow.parquet read, same columns (crc)",
            "parquet -> raw-id batches": "pyarrow.parquet read, same columns (raw)",
            "text -> hashed batches": "pyarrow.csv.read_csv, 1 thread"}
    out = []
    for k in runs:
        row = {"section": "data", "name": k, "rows": n_rows[k], "median": float(np.median(wall[k])),
               "rows_per_sec": wall[k], "cpu_rows_per_sec": cpu[k],
               "cpu_median": float(np.median(cpu[k])), "repeats": repeats}
        if k in refs:
            row["ratio_to_reference"] = float(np.median(np.array(wall[k]) / np.array(wall[refs[k]])))
            row["cpu_ratio_to_reference"] = float(np.median(np.array(cpu[k]) / np.array(cpu[refs[k]])))
            row["reference"] = refs[k]
        if k in floor:
            row["cpu_ratio_to_floor"] = float(np.median(np.array(cpu[k]) / np.array(cpu[floor[k]])))
            row["ratio_to_floor"] = float(np.median(np.array(wall[k]) / np.array(wall[floor[k]])))
        if k.startswith("text"):
            for other in ("pyarrow.csv.read_csv, default threads",
                          "pyarrow.csv.open_csv (streamed), 1 thread"):
                row[f"ratio_to {other}"] = float(np.median(np.array(wall[k]) / np.array(wall[other])))
        out.append(row)
    if convert_rate:
        out.append({"section": "data", "name": "convert text -> parquet (once)", "rows": rows,
                    "median": convert_rate["wall"], "cpu_median": convert_rate["cpu"]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_004_000)
    p.add_argument("--text-rows", type=int, default=0, help="rows of the text passes (0 = all)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workdir", default=WORKDIR, help="where the generated files are kept")
    p.add_argument("--out", default=os.path.join("bench_results", "bench_data.json"))
    args = p.parse_args(argv)
    print(f"load before: {os.getloadavg()}")
    got = bench_data(args.repeats, False, rows=args.rows, workdir=args.workdir,
                     text_rows=args.text_rows or None)
    load = os.getloadavg()
    print(f"load after: {load}")
    for r in got:
        ratio = (f"  x{r['ratio_to_reference']:.2f} of {r['reference'].split(',')[0]} (CPU-time "
                 f"x{r['cpu_ratio_to_reference']:.2f})" if "ratio_to_reference" in r else "")
        ratio += "".join(f", x{v:.2f} of {k[9:]}" for k, v in r.items() if k.startswith("ratio_to "))
        if "cpu_ratio_to_floor" in r:
            ratio += (f", x{r['ratio_to_floor']:.2f} of the layout floor (CPU-time "
                      f"x{r['cpu_ratio_to_floor']:.2f})")
        print(f"  {r['name']:44s} {r['median']:12,.0f} rows/s  per CPU-s {r['cpu_median']:12,.0f}"
              f"{ratio}")
    write_json_atomic(args.out, {"rows": got, "load_after": load})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
