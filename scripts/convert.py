"""Convert text data to Parquet once; train from it with ``--data parquet:DIR``.

    python scripts/convert.py criteo:train.tsv --out data/criteo_pq [--rows-per-group N]
        [--skip-bad-lines] [--multi-hot-len L] [--split-on FIELD]
    python scripts/train.py --data parquet:data/criteo_pq ...

The body, and its full description: recjax/data/convert.py (the format: recjax/data/columnar.py).
"""

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.data.convert import MULTI_HOT_LEN, ROWS_PER_GROUP, convert  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="+", metavar="KIND:PATH",
                   help="inputs of one kind, e.g. criteo:day_0.tsv criteo:day_1.tsv")
    p.add_argument("--out", required=True, help="the folder to write (new, or empty)")
    p.add_argument("--rows-per-group", type=int, default=ROWS_PER_GROUP)
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip and count malformed lines instead of stopping at the first")
    p.add_argument("--multi-hot-len", type=int, default=MULTI_HOT_LEN,
                   help="ids kept per example of a multi-hot field (runs may use fewer)")
    p.add_argument("--split-on", default="", metavar="FIELD",
                   help="a new file wherever this field of exact ids changes: one file per day "
                        "(avazu: weekday) or per hour (hour_of_day), the days of "
                        "--data.order=time")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        m = convert(args.specs, args.out, rows_per_group=args.rows_per_group,
                    skip_bad_lines=args.skip_bad_lines, multi_hot_len=args.multi_hot_len,
                    split_on=args.split_on, log=print)
    except (ValueError, OSError) as e:  # bad input or paths (DataError is a ValueError)
        print(f"error: {e}", file=sys.stderr)
        return 2
    for f in m["files"]:
        for line in (f["read_stats"] or {"first_skipped": []})["first_skipped"]:
            print(f"  skipped {line}")
    print(f"wrote {args.out}: {m['rows']:,} rows, {len(m['files'])} file(s), "
          f"{time.perf_counter() - t0:.1f} s; train with --data parquet:{args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
