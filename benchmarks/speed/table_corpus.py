"""Preparing a parquet or arrow corpus (streamed: parquet through pyarrow, arrow through ``datasets``) against the
same text as a plain file: peak memory and time at several sizes, and the ids compared.

    python benchmarks/speed/table_corpus.py [--format parquet|arrow] [--mb 20 200 800] [--tokenizer byte] \
        [--work /tmp/longseq-tables] [--out benchmarks/results/speed/table-corpus-FORMAT.json]

The text is the bundled tiny-shakespeare repeated until it has ``--mb`` MB, written (in ``--work``, never
committed) as a plain file and as a table of one row per line (column ``text``; parquet row groups and arrow
record batches of 100,000 rows; the arrow file is an IPC stream, as ``Dataset.save_to_disk`` writes).
Each ``longseq data prepare`` runs in its own process, so its peak RSS (``ru_maxrss`` from ``wait4``) is its alone;
the files are made in another process first (a child's ``ru_maxrss`` starts from its parent's RSS at the fork).
If the table is streamed, its peak RSS stays flat as the corpus grows (one batch of rows and one block of text at
a time); read whole, it would grow with the corpus.  The prepared splits' sha256 (index.json) must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build(work: str, megabytes: int, fmt: str = "parquet") -> tuple[str, str]:
    """The plain file and the table file of ``megabytes`` MB of text (made once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, ROOT)
    from longseq.data.sources import bundled_corpus_path

    plain, table = os.path.join(work, f"text-{megabytes}mb.txt"), os.path.join(work, f"text-{megabytes}mb.{fmt}")
    if os.path.exists(plain) and os.path.exists(table):
        return plain, table
    if fmt == "arrow":  # the parquet file's rows, as an IPC stream
        parquet = build(work, megabytes, "parquet")[1]
        with pa.OSFile(table, "wb") as sink, pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as writer:
            for batch in pq.ParquetFile(parquet).iter_batches(batch_size=100_000):
                writer.write_batch(batch)
        return plain, table
    lines = open(bundled_corpus_path(), encoding="utf-8").read().split("\n")
    rows, size = [], 0
    with pq.ParquetWriter(table, pa.schema([("text", pa.string())])) as writer, open(plain, "w", encoding="utf-8") as f:
        while size < megabytes * 1_000_000:
            for line in lines:
                rows.append(line)
                size += len(line.encode()) + 1
                if len(rows) == 100_000:
                    writer.write_table(pa.table({"text": rows}))
                    f.write(("\n" if f.tell() else "") + "\n".join(rows))
                    rows = []
        if rows:
            writer.write_table(pa.table({"text": rows}))
            f.write(("\n" if f.tell() else "") + "\n".join(rows))
    return plain, table


def prepare(data: str, tokenizer: str, out: str) -> dict:
    """One ``longseq data prepare`` in its own process: wall seconds, peak RSS (MiB), the splits' sha256."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "longseq", "data", "prepare", "--data", data, "--tokenizer",
                             tokenizer, "--out", out, "--json", "--quiet"], cwd=ROOT, stdout=subprocess.PIPE)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"longseq data prepare --data {data} failed")
    with open(os.path.join(out, "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    return {
        "seconds": round(seconds, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux: KiB
        "tokens": sum(s["tokens"] for s in index["splits"].values()),
        "sha256": {split: s["sha256"] for split, s in index["splits"].items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=["parquet", "arrow"], default="parquet")
    p.add_argument("--mb", type=int, nargs="+", default=[20, 200, 800])
    p.add_argument("--tokenizer", default="byte")
    p.add_argument("--work", default="/tmp/longseq-tables")
    p.add_argument("--out", help="default: benchmarks/results/speed/table-corpus-FORMAT.json")
    p.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.build_only:
        for megabytes in args.mb:
            build(args.work, megabytes, args.format)
        return
    subprocess.run([sys.executable, __file__, "--build-only", "--format", args.format, "--work", args.work, "--mb",
                    *map(str, args.mb)], check=True)  # fmt: skip
    args.out = args.out or os.path.join(ROOT, "benchmarks", "results", "speed", f"table-corpus-{args.format}.json")
    os.makedirs(args.work, exist_ok=True)
    results = []
    for megabytes in args.mb:
        plain, table = build(args.work, megabytes, args.format)  # made by the --build-only process
        row = {"mb": megabytes, "table_mb": round(os.path.getsize(table) / 1e6, 1)}
        row["plain"] = prepare(plain, args.tokenizer, os.path.join(args.work, "prepared-plain"))
        row["table"] = prepare(table, args.tokenizer, os.path.join(args.work, "prepared-table"))
        row["same_ids"] = row["plain"].pop("sha256") == row["table"].pop("sha256")
        print(json.dumps(row), flush=True)
        results.append(row)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"format": args.format, "tokenizer": args.tokenizer, "cpus": os.cpu_count(), "results": results}, f,
                  indent=1)  # fmt: skip
        f.write("\n")


if __name__ == "__main__":
    main()
