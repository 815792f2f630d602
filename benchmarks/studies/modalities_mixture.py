"""One model across modalities against one model per modality at equal total compute (issue 59): text bytes, DNA,
mu-law audio and SMILES, the same number of training tokens of each.

``build`` cuts every source to ``--tokens`` training tokens (a tenth of that for valid and test) and writes each
modality as its own corpus (``text/`` and ``dna/``: ``{split}.txt``; ``audio/``: 16 kHz WAV excerpts and
``{split}.m3u``; ``smiles/``: ``{split}.smi``), the ``mixture/`` of all four (``{split}.mix``: the files of every
modality in ``--chunks`` pieces, interleaved, so that every batch row passes through every modality), and
``eval-MODALITY/``, one modality's files as a mixture, on which the mixture model is scored per modality.

``run`` trains, per seed, the mixture model for ``--steps`` steps and each single model for ``--steps / 4`` (the same
model, batch and segment: equal total compute, up to the softmax's width: the mixture's vocabulary is the four
together), scores every model on its modality's test split in bits per token of that modality (audio: per sample;
modality tokens and clip starts left out), and writes the table: the mixture's bits against the single model's, and
whether it is within 3%.

Sources (never committed): text: any UTF-8 file (PTB's train); DNA: a FASTA file, ``.gz`` or not (its sequence lines,
upper-cased, in lines of 100); audio: a folder of tracks (the Wesnoth soundtrack); SMILES: a ``.smi`` file (the
MOSES train split from ``smiles_moses.py prepare``).  Commands (resumable)::

    python benchmarks/studies/modalities_mixture.py build --out /work/data/mixture --tokens 2000000 \\
        --text ../shared/data/ptb/ptb.train.txt --dna /work/data/smalt/usr/share/doc/smalt/test/data/hs37chrXtrunc.fa.gz \\
        --audio /work/data/wesnoth/usr/share/games/wesnoth/1.16/data/core/music --smiles /work/data/moses/train.smi
    python benchmarks/studies/modalities_mixture.py run --data /work/data/mixture --out runs/mixture --seeds 1 2 3 \\
        --steps 8000 --store benchmarks/results/modalities-mixture
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from modality_runs import TREE, finished, longseq, machine, mean_std, table, train, write_json  # noqa: E402

MODALITIES = {"text": "byte", "dna": "char", "audio": "mulaw", "smiles": "smiles"}
SPLITS = {"train": 1.0, "valid": 0.1, "test": 0.1}
BASE = ["n_layer=4", "d_model=128", "n_head=4", "d_head=32", "d_inner=512", "tgt_len=256", "eval_tgt_len=256",
        "mem_len=256", "batch_size=16", "eval_batch_size=16", "dropout=0.1", "lr=0.002", "warmup_steps=200",
        "clip_seconds=1", "eval_interval=1000", "eval_max_segments=20"]  # fmt: skip


def _lines(text: str, width: int = 100) -> str:
    return "".join(text[i : i + width] + "\n" for i in range(0, len(text), width))


def _cut(text: str, sizes: dict[str, int]) -> dict[str, str]:
    """Consecutive pieces of ``text`` of ``sizes`` characters, each ending at a line end."""
    out, start = {}, 0
    for split, size in sizes.items():
        stop = text.find("\n", start + size) + 1 or len(text)
        out[split], start = text[start:stop], stop
        if not out[split]:
            raise SystemExit(f"the source is too short for {split}: lower --tokens")
    return out


def build_texts(args, sizes) -> dict[str, dict[str, str]]:
    """The text, DNA and SMILES of every split."""
    with open(args.text, encoding="utf-8") as f:
        text = f.read(sum(sizes.values()) * 2)
    opener = gzip.open if args.dna.endswith(".gz") else open
    with opener(args.dna, "rt") as f:  # the sequence lines of a FASTA file, without its N runs
        dna, need = [], sum(sizes.values())
        for line in f:
            if not line.startswith(">") and (seq := line.strip().upper().replace("N", "")):
                dna.append(seq)
                need -= len(seq)
                if need < 0:
                    break
    with open(args.smiles, encoding="utf-8") as f:
        smiles = f.read(sum(sizes.values()) * 2)
    return {"text": _cut(text, sizes), "dna": _cut(_lines("".join(dna)), sizes), "smiles": _cut(smiles, sizes)}


def build_audio(args, sizes, out: str) -> dict[str, list[str]]:
    """16 kHz WAV excerpts of the tracks, ``sizes`` samples per split, in ``--chunks`` files a split (a minute at
    most each); a split starts on a track of its own."""
    sys.path.insert(0, TREE)
    from longseq.data.audio import read_audio, to_mono_16k, write_wav

    tracks = sorted(
        os.path.join(args.audio, n) for n in os.listdir(args.audio) if n.endswith((".ogg", ".wav", ".flac"))
    )
    files, pending = {s: [] for s in sizes}, iter(tracks)
    for split, size in sizes.items():
        while size > 0:
            track = next(pending)
            with open(track, "rb") as f:
                mono = to_mono_16k(*read_audio(f.read(), track))
            step = 16000 * min(60, max(1, sizes[split] // args.chunks // 16000))  # whole 1-second clips
            for start in range(0, min(len(mono), size), step):
                part = mono[start : min(start + step, size)]
                if len(part) < 16000:  # less than a clip: nothing a model would read
                    break
                name = f"{split}-{len(files[split]):03d}.wav"
                write_wav(os.path.join(out, name), part)
                files[split].append(name)
            size -= min(len(mono), size)
    return files


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def build(args) -> dict:
    sizes = {split: int(args.tokens * share) for split, share in SPLITS.items()}
    texts = build_texts(args, sizes)
    for modality in MODALITIES:
        os.makedirs(os.path.join(args.out, modality), exist_ok=True)
    audio = build_audio(args, sizes, os.path.join(args.out, "audio"))
    pieces: dict[str, dict[str, list[str]]] = {m: {} for m in MODALITIES}
    for split in SPLITS:
        _write(os.path.join(args.out, "audio", f"{split}.m3u"), "".join(f + "\n" for f in audio[split]))
        pieces["audio"][split] = [os.path.join("audio", f) for f in audio[split]]
        for modality, suffix in (("text", "txt"), ("dna", "txt"), ("smiles", "smi")):
            _write(os.path.join(args.out, modality, f"{split}.{suffix}"), texts[modality][split])
            chunks = _cut(
                texts[modality][split], {i: len(texts[modality][split]) // args.chunks for i in range(args.chunks)}
            )
            for i, chunk in chunks.items():
                _write(os.path.join(args.out, modality, f"{split}-{i:03d}.{suffix}"), chunk)
            pieces[modality][split] = [os.path.join(modality, f"{split}-{i:03d}.{suffix}") for i in chunks]
    for name, chosen in [("mixture", list(MODALITIES))] + [(f"eval-{m}", [m]) for m in MODALITIES]:
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        for split in SPLITS:
            lists = [[(m, f) for f in pieces[m][split]] for m in chosen]
            order = [entry for group in _interleave(lists) for entry in group]
            _write(os.path.join(args.out, name, f"{split}.mix"), "".join(f"{m} ../{f}\n" for m, f in order))
    return {"tokens": sizes, "audio_files": {s: len(f) for s, f in audio.items()}}


def _interleave(lists: list[list]) -> list[list]:
    """The entries of ``lists`` round-robin: [[a0, b0, ...], [a1, b1, ...], ...]."""
    longest = max(len(entries) for entries in lists)
    return [[entries[i] for entries in lists if i < len(entries)] for i in range(longest)]


def bits_of(scores: dict) -> float:
    for key in ("bits_per_sample", "bits_per_token", "bpc"):
        if key in scores:
            return scores[key]
    return scores["loss"] / np.log(2)  # SMILES: bits per token


def run_one(args, name: str, seed: int, data: str, steps: int, tokenizer: str) -> dict:
    out = os.path.join(args.out, name, f"seed{seed}")
    stored = os.path.join(args.store, name, f"seed{seed}", "result.json") if args.store else None
    result = finished(os.path.join(out, "result.json")) or (finished(stored) if stored else None)
    if result:
        return result
    trained = train(out, os.path.join(args.data, data), [*BASE, f"tokenizer={tokenizer}", f"seed={seed}",
                                                          f"max_steps={steps}", *args.set])  # fmt: skip
    evals = [m for m in MODALITIES if name in ("mixture", m)]
    scores = {m: longseq(["eval", "--checkpoint", out, "--data", os.path.join(args.data, m if name != "mixture" else f"eval-{m}"),
                          "--split", "test", "--set", f"max_segments={args.eval_segments}"]) for m in evals}  # fmt: skip
    result = {"model": name, "seed": seed, "steps": steps, "train": trained, "test": scores,
              "bits": {m: bits_of(s) for m, s in scores.items()}, "machine": machine()}  # fmt: skip
    write_json(os.path.join(out, "result.json"), result)
    if stored:
        write_json(stored, result)
    return result


def run(args) -> None:
    single = max(1, args.steps // len(MODALITIES))
    results = {"mixture": [run_one(args, "mixture", s, "mixture", args.steps, "mixture") for s in args.seeds]}
    for modality, kind in MODALITIES.items():
        results[modality] = [run_one(args, modality, s, modality, single, kind) for s in args.seeds]
    rows = []
    for modality in MODALITIES:
        alone, _ = mean_std([r["bits"][modality] for r in results[modality]])
        mixed, _ = mean_std([r["bits"][modality] for r in results["mixture"]])
        gap = mixed / alone - 1
        rows.append([modality, alone, mixed, f"{gap:+.1%}", "yes" if gap <= 0.03 else "no"])
    text = table(["modality", f"alone ({single} steps)", f"mixture ({args.steps} steps)", "mixture/alone - 1",
                  "within 3%"], rows)  # fmt: skip
    if args.store:
        write_json(os.path.join(args.store, "summary.json"), {"runs": results, "single_steps": single})
        _write(os.path.join(args.store, "summary.md"), text)
    print(text)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build")
    for flag in ("--out", "--text", "--dna", "--audio", "--smiles"):
        b.add_argument(flag, required=True)
    b.add_argument("--tokens", type=int, default=2_000_000, help="training tokens of each modality")
    b.add_argument("--chunks", type=int, default=8, help="pieces each modality's split is cut into for the mixture")
    r = sub.add_parser("run")
    r.add_argument("--data", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--store")
    r.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    r.add_argument("--steps", type=int, default=8000, help="the mixture model's steps; each single model a quarter")
    r.add_argument("--eval-segments", type=int, default=0, help="test segments scored (0: all)")
    r.add_argument("--set", nargs="*", default=[])
    args = p.parse_args(argv)
    if args.step == "build":
        print(build(args))
    else:
        run(args)


if __name__ == "__main__":
    main()
