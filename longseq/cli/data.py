"""``longseq data``: tokenize a corpus once into a prepared directory (``prepare``), or generate task data
(``listops``, LRA ListOps).

    longseq data prepare --data PATH --tokenizer byte|char|word|bpe|FILE.json [--vocab-size 8192] --out DIR
    longseq data prepare --data CORPUS.parquet|.arrow|.jsonl [--text-column text] --tokenizer ... --out DIR
    longseq data listops --out DIR [--seed N] [--train 2000 --valid 200 --test 200]
    longseq data reads --data FASTA|DIR --out DIR [--label-by region|file] [--regions 4] [--min-length 1000
        --max-length 32000] [--train 2000 --valid 200 --test 200] [--seed N]

``reads`` writes the classify task's JSON lines: reads of a genome labelled by the region (or, for a directory of
FASTA files, the file: an organism) they come from, the splits from disjoint positions.

``longseq train --data DIR`` and ``longseq eval --data DIR`` then read DIR by memory map.  ``prepare`` reports its
progress on stderr (bytes and files read, tokens written): a bar on a terminal, a plain line every 30 seconds
elsewhere (a log, CI, nohup); ``--quiet``: none.
"""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, refuse_vocab_size, tokenizer_help


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "data",
        help="prepare a corpus (tokenize once, read by memory map) or generate task data",
        description="prepare: tokenize a corpus once into --out (progress on stderr: a bar on a terminal, plain "
        "lines elsewhere, none with --quiet); listops: generate LRA ListOps JSONL into --out; reads: reads of a "
        "FASTA genome labelled by region or file, as classify JSONL into --out",
    )
    p.add_argument("kind", choices=["prepare", "listops", "reads"])
    p.add_argument("--out", required=True, help="the directory to write")
    prepare = p.add_argument_group("prepare")
    prepare.add_argument("--data", help="corpus file or directory (default: bundled tiny-shakespeare)")
    prepare.add_argument("--tokenizer", help=tokenizer_help())
    prepare.add_argument("--vocab-size", type=int, help="tokens of a BPE to learn (default 8192)")
    prepare.add_argument("--lowercase", action="store_true", help="word tokenizer: lowercase the text")
    prepare.add_argument(
        "--text-column",
        default="text",
        help="a table (.parquet, .arrow, .jsonl; read streamed through datasets): the column of text, its rows "
        "joined by newlines (default: %(default)s)",
    )
    prepare.add_argument(
        "--clip-seconds",
        type=float,
        default=0.0,
        help="audio: cut every file into clips of this length, a shorter tail dropped (SaShiMi: 8; default 0: whole)",
    )
    listops = p.add_argument_group("listops")
    listops.add_argument("--seed", type=int, default=0)
    listops.add_argument("--train", type=int, default=2000)
    listops.add_argument("--valid", type=int, default=200)
    listops.add_argument("--test", type=int, default=200)
    listops.add_argument("--min-length", type=int, help="listops: 500 tokens; reads: 1000 bases")
    listops.add_argument("--max-length", type=int, help="listops: 2000 tokens; reads: 32000 bases")
    reads = p.add_argument_group("reads (with --data, --seed, --train, --valid, --test, --min-length, --max-length)")
    reads.add_argument("--label-by", choices=["region", "file"], default="region")
    reads.add_argument("--regions", type=int, default=4, help="equal stretches of each sequence (default 4)")
    reads.add_argument("--max-n", type=float, default=0.1, help="the largest share of N in a read (default 0.1)")
    reads.add_argument("--plus-strand-only", action="store_true", help="no read from the reverse complement")
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    if args.kind == "prepare":
        return run_prepare(args)
    sizes = {"train": args.train, "valid": args.valid, "test": args.test}
    if args.kind == "reads":
        return run_reads(args, sizes)
    from longseq.data.tasks import write_listops

    lengths = {"min_length": args.min_length or 500, "max_length": args.max_length or 2000}
    return {"out": args.out, "seed": args.seed, **write_listops(args.out, args.seed, sizes, **lengths)}


def run_reads(args: argparse.Namespace, sizes: dict[str, int]) -> dict:
    from longseq.data.reads import write_reads

    if args.data is None:
        raise ValueError("longseq data reads needs --data: a FASTA file or a directory of them")
    lengths = (args.min_length or 1000, args.max_length or 32000)
    return write_reads(
        args.data,
        args.out,
        sizes,
        label_by=args.label_by,
        regions=args.regions,
        lengths=lengths,
        max_n=args.max_n,
        both_strands=not args.plus_strand_only,
        seed=args.seed,
    )


def run_prepare(args: argparse.Namespace) -> dict:
    from longseq.config import DataConfig
    from longseq.data.prepared import prepare_corpus
    from longseq.data.tokenizers import DEFAULT_BPE_VOCAB

    if args.tokenizer is None:
        raise ValueError(f"longseq data prepare needs --tokenizer ({tokenizer_help()})")
    refuse_vocab_size(args.vocab_size, args.tokenizer)
    vocab_size = DEFAULT_BPE_VOCAB if args.vocab_size is None else args.vocab_size
    DataConfig(  # a run's checks
        tokenizer=args.tokenizer, vocab_size=vocab_size, text_column=args.text_column, clip_seconds=args.clip_seconds
    )
    return prepare_corpus(
        args.data,
        args.tokenizer,
        args.out,
        vocab_size=vocab_size,
        lowercase=args.lowercase,
        progress=not args.quiet,
        text_column=args.text_column,
        clip_seconds=args.clip_seconds,
    )
