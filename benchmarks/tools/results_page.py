"""BENCHMARKS.md, generated from the stored results: one table per question, each with its command, machine and date.

    python benchmarks/tools/results_page.py            # writes BENCHMARKS.md
    python benchmarks/tools/results_page.py --check    # exit 1 when BENCHMARKS.md is not what the results give

Every figure is read from ``benchmarks/results/``: the per-seed ``result.json`` files of the runner's stores (the
spreads are computed here from them), the runner's ``summary.json`` where only the summary was kept, ListOps's and
context_clamp's own JSON, and ``results/speed/*.json``, where the timing harnesses' figures were transcribed with
their commands.  Each study's ``study.json`` gives its question, commands, machine and date, and a README.md beside
it tells how the study went.  Reads JSON only, trains and times nothing: ``tests/test_results_page.py`` runs it.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import json
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
BITS = 1 / math.log(2)  # nats to bits
PAGE = os.path.join(ROOT, "BENCHMARKS.md")
MACHINE = "dev-cpu: 2 cores (AMD EPYC, x86_64), 24 GiB, no GPU; Python 3.11.7, torch 2.13.0+cpu, 2 threads"


# --- reading -----------------------------------------------------------------------------------------------------


def load(path: str) -> dict:
    with open(os.path.join(RESULTS, path), encoding="utf-8") as f:
        return json.load(f)


def seed_paths(store: str, variant: str) -> list[str]:
    """The result files of ``variant``'s finished runs in a runner store (none yet: an empty list)."""
    return sorted(glob.glob(os.path.join(RESULTS, store, variant, "seed*", "result.json")))


def seeds(store: str, variant: str) -> list[dict]:
    """The finished runs of ``variant`` in a runner store, by seed."""
    paths = seed_paths(store, variant)
    if not paths:
        raise SystemExit(f"no stored result for {variant} under benchmarks/results/{store}")
    return [load(os.path.relpath(p, RESULTS)) for p in paths]


def stats(values: list[float]) -> dict:
    """Mean, sample std and range: what the runner's summary computes."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": n, "values": values}


def test_stats(store: str, variant: str, key: str = "bpc") -> dict:
    """Test bpc (or ``ppl``) over the stored seeds of a variant."""
    return stats([r["test"][key] for r in seeds(store, variant)])


def summary_stats(folder: str, variant: str) -> dict:
    return load(f"{folder}/summary.json")["variants"][variant]["test_bpc"]


# --- formatting --------------------------------------------------------------------------------------------------


def table(header: list[str], rows: list[list], right: str = "") -> list[str]:
    """A markdown table; ``right`` marks the right-aligned columns with "r" (e.g. "lrr")."""
    align = ["-:" if right[i : i + 1] == "r" else "-" for i in range(len(header))]
    lines = ["|" + "|".join(header) + "|", "|" + "|".join(align) + "|"]  # unpadded: the page must stay small
    return lines + ["|" + "|".join("" if c is None else str(c) for c in row) + "|" for row in rows]


def num(value, digits: int = 0) -> str:
    """``1,867`` or ``0.395``: thousands separated, a fixed number of decimals; None is empty."""
    return "" if value is None else f"{value:,.{digits}f}"


def spread(s: dict, digits: int = 4, ranges: bool = True) -> str:
    """``mean ± std [min, max]`` over seeds (``mean ± std`` without ``ranges``), or the one value."""
    if s["n"] == 1:
        return f"{s['mean']:.{digits}f} (1 seed)"
    text = f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"
    return text + (f" [{s['min']:.{digits}f}, {s['max']:.{digits}f}]" if ranges else "")


def gain(base: dict, other: dict) -> str:
    """How much lower ``other``'s mean is than ``base``'s, in percent (positive: better)."""
    return f"{100 * (base['mean'] - other['mean']) / base['mean']:+.2f}%"


def apart(a: dict, b: dict) -> str:
    """Whether the seeds' ranges are apart (the runner's rule: never with one seed)."""
    if min(a["n"], b["n"]) < 2:
        return "(1 seed)"
    return "yes" if a["max"] < b["min"] or b["max"] < a["min"] else "no"


def pct(value: float, digits: int = 2) -> str:
    """An accuracy as a percentage without trailing zeros: 0.369 -> 36.9%."""
    return f"{100 * value:.{digits}f}".rstrip("0").rstrip(".") + "%"


def section(title: str, study: dict, body: list[str], where: str, level: str = "##") -> list[str]:
    """A heading, the machine and date, where the results lie, the commands, then the body."""
    head = [f"{level} {title}", f"*{study['machine']}, {study['date']}; `{where}`*"]
    return [*head, "", "```bash", *study["commands"], "```", "", *body, ""]


# --- the sections ------------------------------------------------------------------------------------------------


def headline() -> list[str]:
    """The page's opening: what is here, how to regenerate it, and the two answers most readers want."""
    hf = load("speed/vs-hf.json")
    train, evaluation = hf["training"]["rows"], hf["evaluation"]["rows"]
    paper = (summary_stats("table6-ptb-char-3000", "no-memory"), summary_stats("table6-ptb-char-3000", "xl"))
    step2 = load("recipe/ptb-char-3000/step2/summary.json")["variants"]
    long = load("recipe/ptb-char-6000/summary.json")["variants"]
    wt2 = (test_stats("wt2-word-3000", "no-memory"), test_stats("wt2-word-3000", "xl"))
    return [
        "# Benchmarks",
        "",
        "One table per question with its command, machine and date, generated from `benchmarks/results/` (a",
        "README.md per study) by `benchmarks/tools/results_page.py`; `--check` fails when they disagree.",
        "↑/↓: higher/lower is better. Corpora: `$LONGSEQ_DATA`.",
        "Machine **" + MACHINE + "**.",
        "",
        f"**How fast.** Against Hugging Face TransfoXL with the same weights: training {train[0]['speedup']:.2f}x as"
        f" fast at 128/128 and {train[1]['speedup']:.2f}x at 512/512, evaluation in {evaluation[0]['ratio']:.2f}x"
        f" and {evaluation[1]['ratio']:.2f}x of its time (memory 1,600, 3,800), generation"
        f" {hf['generation']['speedup']:.1f}x as fast.",
        "",
        f"**What the memory buys.** On character PTB, XL's test bpc is {gain(*paper)} better than without memory"
        " at the paper's settings, "
        f"{gain(step2['no-memory-no-r-dropout']['test_bpc'], step2['xl-curriculum-0-no-r-dropout']['test_bpc'])}"
        " with the recipe (memory curriculum, R kept whole), "
        f"{gain(long['no-memory-no-r-dropout']['test_bpc'], long['xl-curriculum-0-no-r-dropout-6k']['test_bpc'])}"
        f" at 6,000 steps; on WikiText-2 words {gain(*wt2)} (3 seeds each). Longer memories at evaluation do not help.",
        "",
    ]


def memory_rows() -> list[list]:
    """(comparison, corpus and budget, baseline stats, stats with the memory, unit) for the memory table."""
    t6, r1 = "table6-ptb-char-3000", "recipe/ptb-char-3000"
    step2, long, big = f"{r1}/step2", "recipe/ptb-char-6000", "recipe/ptb-char-d256-3000"
    fair, step2_xl = "no-memory-no-r-dropout", "xl-curriculum-0-no-r-dropout"
    preset = "preset-tiny-shakespeare-1200"
    return [
        ["XL (paper settings) vs no memory", "char PTB, 3k steps",
         summary_stats(t6, "no-memory"), summary_stats(t6, "xl")],
        ["step 1: memory curriculum (0 to 128 in 2,000 steps)", "char PTB, 3k steps",
         summary_stats(r1, "no-memory"), summary_stats(r1, "xl-curriculum-0")],
        ["step 2: curriculum, R kept whole (vs no memory, R whole)", "char PTB, 3k steps",
         summary_stats(step2, fair), summary_stats(step2, step2_xl)],
        ["step 2, twice the steps (ramp over 4,000)", "char PTB, 6k steps",
         summary_stats(long, fair), summary_stats(long, f"{step2_xl}-6k")],
        ["step 2, d_model 256 (3.43M parameters)", "char PTB, 3k steps",
         summary_stats(big, fair), summary_stats(big, step2_xl)],
        ["XL vs no memory (bits per word)", "WikiText-2 words, 3k",
         test_stats("wt2-word-3000", "no-memory"), test_stats("wt2-word-3000", "xl")],
        ["the preset's recipe vs no memory", "tiny-shakespeare, 1.2k",
         summary_stats(preset, "no-memory"), summary_stats(preset, "preset-recipe")],
    ]  # fmt: skip


def memory_section() -> list[str]:
    rows = [[what, where, spread(base, ranges=False), spread(mem, ranges=False), gain(base, mem), apart(base, mem)]
            for what, where, base, mem in memory_rows()]  # fmt: skip
    body = [
        "Test bpc ↓, mean ± std over seeds; 4 layers, d_model 128 (863k parameters), tgt_len 64, mem_len 128.",
        "",
        *table(["comparison", "corpus, budget", "baseline", "with it", "better by", "apart"], rows, "llllrl"),
    ]
    study = load("recipe/study.json")
    study = {**study, "commands": study["commands"][:3]}  # the 3-seed rows; the others: recipe/README.md
    return section("What the memory buys", study, body, "recipe/ (README: all commands)")


def hf_section() -> list[str]:
    hf = load("speed/vs-hf.json")
    train, ev, gen = hf["training"]["rows"], hf["evaluation"]["rows"], hf["generation"]
    rows = [
        [
            "training tokens/s ↑, batch 8",
            f"{r['tgt_len']} / {r['mem_len']}",
            num(r["longseq_tokens_per_s"]),
            num(r["hf_tokens_per_s"]),
            f"**{r['speedup']:.2f}x**",
        ]
        for r in train
    ]
    rows += [
        [
            "training peak RSS MiB ↓",
            f"{r['tgt_len']} / {r['mem_len']}",
            num(r["longseq_peak_rss_mib"]),
            num(r["hf_peak_rss_mib"]),
            f"{r['rss_ratio']:.2f}",
        ]
        for r in train
    ]
    rows += [
        [
            "evaluation ms/token ↓, batch 1",
            f"memory {num(r['mem_len'])}",
            f"{r['longseq_ms_per_token']:.3f}",
            f"{r['hf_ms_per_token']:.3f}",
            f"**{r['ratio']:.2f}**",
        ]
        for r in ev
    ]
    rows += [["generation tokens/s ↑, 256 after 2,000", f"memory {num(gen['mem_len'])}",
              f"{gen['longseq_tokens_per_s']:.1f}", f"{gen['hf_tokens_per_s']:.1f}", f"**{gen['speedup']:.1f}x**"],
             ["generation peak RSS MiB ↓", f"memory {num(gen['mem_len'])}", num(gen["longseq_peak_rss_mib"]),
              num(gen["hf_peak_rss_mib"]), f"{gen['rss_ratio']:.2f}"]]  # fmt: skip
    llama = hf["llama"]
    rows += [["llama-xl block: evaluation ms/token ↓", f"memory {num(r['mem_len'])}", f"{r['longseq_ms_per_token']:.3f}",
              f"{r['hf_ms_per_token']:.3f}", f"**{r['ratio']:.2f}**"] for r in llama["evaluation"]]  # fmt: skip
    g = llama["generation"]
    rows += [["llama-xl block: generation tokens/s ↑", f"memory {num(g['mem_len'])}", f"{g['longseq_tokens_per_s']:.1f}",
              f"{g['hf_tokens_per_s']:.1f}", f"**{g['speedup']:.1f}x**"]]  # fmt: skip
    body = [
        "4 layers, d_model 256, bytes, float32, the same weights; own processes, alternating; training against length"
        f" ({hf['scaling']['rows'][-1]['speedup']:.2f}x at {num(hf['scaling']['rows'][-1]['length'])}): `speed/README.md`.",
        "",
        *table(["measure", "tgt_len / mem_len", "longseq", "HF", "longseq vs HF"], rows, "llrrr"),
        "",
        hf_later_line(hf["later"]),
    ]
    return section("Speed against Hugging Face TransfoXL", hf, body, "speed/vs-hf.json")


def hf_later_line(later: dict) -> str:
    """The later sittings' generation speed-ups and evaluation ratios at memory 1,600 (``later`` in vs-hf.json)."""
    gen = {side: next(r for r in later[side] if r["task"] == "generate")["speedup"] for side in ("default", "llama")}
    ev = [next(r for r in later[k] if r.get("mem_len") == 1600)["time_ratio"] for k in ("default", "eval_again")]
    return (f"At {later['commit']}: generation {gen['default']:.1f}x, llama-xl {gen['llama']:.1f}x; evaluation at"
            f" 1,600 {ev[0]:.2f} and {ev[1]:.2f} (two sittings).")  # fmt: skip


def vanilla_section() -> list[str]:
    data = load("speed/eval-vs-vanilla.json")
    rows = [[num(r["attn_len"]), f"{r['xl_ms']:.3f}", num(r["vanilla_ms"]), f"**{r['ratio']:,}x**",
             f"{r['paper_table9']:,}x", r["original_code"]] for r in data["rows"]]  # fmt: skip
    header = ["attn_len", "XL ms ↓", "vanilla ms", "vanilla / XL", "paper, Table 9", "original code (issue)"]
    body = [
        "Milliseconds per token, batch 1: XL reads 128-token segments with a memory of attn_len; the vanilla model",
        "recomputes a window of attn_len per token; with glibc's mmap off: `speed/README.md`.",
        "",
        *table(header, rows, "r" * 6),
    ]
    data = {**data, "commands": data["commands"][:1]}
    return section("Evaluation speed: XL against the vanilla sliding window", data, body, "speed/eval-vs-vanilla.json")


def patterns_section() -> list[str]:
    data = load("speed/patterns.json")
    cell = lambda v: "skip" if v is None else (v if isinstance(v, str) else num(v))  # noqa: E731
    rows = [[r["pattern"], *map(cell, r["us_per_token"]), r["time_32k_over_2k"], r["pairs_32k_over_2k"]]
            for r in data["rows"]]  # fmt: skip
    lengths = [f"{n // 1024}k" for n in data["lengths"]]
    body = [
        "Training, µs per token ↓ (d_model 256, batch 1, mem_len 256); pairs: (query, key) pairs allowed per token.",
        "",
        *table(["pattern", *lengths, "time 32k / 2k", "pairs 32k / 2k"], rows, "l" + "r" * 8),
    ]
    return section("Attention patterns against sequence length", data, body, "speed/patterns.json")


def after_fix_line(fix: dict) -> str:
    """The linear family's 1k and 32k training times again, after the scans' quadratic backward was fixed."""
    cells = [f"{stack} {t['1024']} -> {t['32768']} µs ({t['32768'] / t['1024']:.2f}x)"
             for stack, t in fix["us_per_token"].items() if "32768" in t]  # fmt: skip
    return f"After the chunked scans' fix ({fix['commit']}), 1k -> 32k: " + "; ".join(cells) + "."


def gla_fix_clause(fix: dict) -> str:
    """gla's 1k and 32k training times after its scan stopped keeping the pairwise decays (its step memory: the
    JSON)."""
    t = fix["us_per_token"]
    return f" gla after its scan's memory fix ({fix['commit']}): {t['1024']} -> {t['32768']} µs ({t['32768'] / t['1024']:.2f}x)."


def delta_performer_clause(fix: dict) -> str:
    """delta (with its short convolution) and the performer, 1k and 32k, measured after the others."""
    t = fix["us_per_token"]
    cells = [f"{n} {t[n]['1024']} -> {t[n]['32768']} µs ({t[n]['32768'] / t[n]['1024']:.2f}x)" for n in t]
    return f" At {fix['commit']}: " + "; ".join(cells) + "."


def mixers_speed_section() -> list[str]:
    data = load("speed/mixers-speed.json")
    train = data["training"]
    ratio = lambda v: "" if v is None else f"{v:.2f}"  # noqa: E731
    last = lambda r: None if r["us_per_token"][-1] is None else r["us_per_token"][-1] / r["us_per_token"][0]  # noqa: E731
    rows = [[r["stack"], *("skip" if v is None else num(v) for v in r["us_per_token"]), ratio(r["time_16k_over_2k"]),
             ratio(last(r))] for r in train["rows"]]  # fmt: skip
    gen = data["generation_linear"]
    flat = "; ".join(f"{r['stack']} {' / '.join(f'{v:g}' for v in r['ms_per_new_token'])} ms, peak "
                     f"{' / '.join(f'{v:.0f}' for v in r['peak_mb'])} MB" for r in gen["rows"])  # fmt: skip
    body = [
        "Training, µs per token ↓ (d_model 256, batch 1, one segment of the length per step); generation: README.",
        "",
        *table(["stack", *(f"{n // 1024}k" for n in train["lengths"]), "16k / 2k", "32k / 1k"], rows, "l" + "r" * 8),
        "",
        after_fix_line(data["after_unbind_fix"])
        + gla_fix_clause(data["gla_memory_fix"])
        + delta_performer_clause(data["delta_performer"]),
        "",
        f"Generation of the linear family after prompts of {' / '.join(f'{n // 1024}k' for n in gen['contexts'])}"
        f" tokens (per new token; peak RSS over the base): {flat}.",
    ]
    return section("State-space and hybrid stacks: speed against length", data, body, "speed/mixers-speed.json")


TABLE6 = {"xl": "Transformer-XL", "no-memory": "without recurrence", "shaw": "Shaw et al. encoding, recurrence",
          "vanilla": "vanilla (absolute, no memory)"}  # fmt: skip


def versus(name: str, base_name: str, base: dict, s: dict) -> str:
    """The relative gain over the baseline and whether the seeds' ranges are apart (empty for the baseline)."""
    if name == base_name:
        return ""
    verdict = apart(base, s)
    return f"{gain(base, s)} {verdict if verdict.startswith('(') else '(apart)' if verdict == 'yes' else '(overlap)'}"


def table6_section() -> list[str]:
    char = load("table6-ptb-char-3000/summary.json")
    recl = char["recl"]["by_variant"]
    base_c, base_w = char["variants"]["no-memory"]["test_bpc"], test_stats("wt2-word-3000", "no-memory")
    rows = []
    for name, label in TABLE6.items():
        c, w = char["variants"][name]["test_bpc"], test_stats("wt2-word-3000", name)
        ppl = test_stats("wt2-word-3000", name, "ppl")["mean"]
        rows.append([label, spread(c, ranges=False), versus(name, "no-memory", base_c, c),
                     " / ".join(map(str, recl[name]["r0.1"])), spread(w, ranges=False), f"{ppl:.1f}",
                     versus(name, "no-memory", base_w, w)])  # fmt: skip
    header = ["model", "char PTB bpc ↓", "vs no recurrence", "RECL r=0.1",
              "WikiText-2 bits/word ↓", "ppl", "vs no recurrence"]  # fmt: skip
    body = [
        "The paper's settings, 3 seeds, 3,000 steps; vanilla scored by sliding windows of 64; RECL per seed.",
        "",
        *table(header, rows, "llllllrl"),
    ]
    study = load("table6-ptb-char-3000/study.json")
    study = {**study, "commands": [*study["commands"], load("wt2-word-3000/study.json")["commands"][1]]}
    return section("The paper's ablation (Table 6 form)", study, body, "table6-ptb-char-3000/, wt2-word-3000/")


BLOCK = {  # (store, variant): label; XL is the compaction study's (same base, steps and seeds)
    ("compaction-ptb-char-3000", "xl"): "XL: sinusoidal relative, u and v",
    ("positions-ptb-char-3000", "rope"): "rope (all channels, theta 10,000)",
    ("positions-ptb-char-3000", "alibi"): "ALiBi",
    ("positions-ptb-char-3000", "t5"): "T5 bucketed bias",
    ("block-ptb-char-3000", "llama-xl"): "llama-xl block (rope, RMSNorm, SwiGLU, GQA 2/4, QK-norm)",
    ("block-ptb-char-3000", "gpt"): "llama-xl block, no memory, context 192",
}  # fmt: skip


def memory_curve(runs: list[dict], context: int) -> str:
    """Mean test bpc over seeds at an evaluation memory (the runner's context curve, same_length)."""
    values = [r["context_curve"]["loss"][r["context_curve"]["contexts"].index(context)] * BITS for r in runs]
    return f"{sum(values) / len(values):.3f}"


def wt2_block_line() -> str:
    """The block study's WikiText-2 rows stored so far (``wt2-block-3000``) beside XL's (``wt2-word-3000``)."""
    xl = test_stats("wt2-word-3000", "xl")
    cells = [f"XL {few_seeds(xl)}"]
    for name, label in (("llama-xl", "llama-xl"), ("gpt", "its no-memory GPT")):
        if seed_paths("wt2-block-3000", name):
            cells.append(f"{label} {few_seeds(test_stats('wt2-block-3000', name))}")
    positions = []
    for name in ("rope", "alibi", "t5"):  # the position encodings' rows stored so far
        if seed_paths("wt2-positions-3000", name):
            runs = seeds("wt2-positions-3000", name)  # context curve: memory 0, 64, 128 (1x), 256 (2x), 512 (4x)
            curve = [sum(r["context_curve"]["loss"][i] for r in runs) / len(runs) for i in (2, 3, 4)]
            curve_text = " / ".join(f"{c:.2f}" for c in curve)
            positions.append(f"{name} {few_seeds(test_stats('wt2-positions-3000', name))} ({curve_text})")
    if positions:
        cells.append("`wt2-positions-3000/` (nats at eval memory 1x / 2x / 4x): " + ", ".join(positions))
    return (
        "WikiText-2 words, bits per word ↓ (5.15M parameters, 3,000 steps, 3 seeds; `wt2-block-3000/`): "
        + "; ".join(cells)
        + "."
    )


def rope_scaling_line() -> str:
    """RoPE's scalings applied at evaluation (``rope_scaling.py``): mean bpc over seeds at each evaluation memory."""
    data = load("positions-ptb-char-3000/rope-scaling.json")
    seeds = list(data["seeds"].values())
    cells = []
    for i, row in enumerate(seeds[0]):
        means = [sum(s[i]["bpc"][j] for s in seeds) / len(seeds) for j in range(len(data["contexts"]))]
        name = "none" if row["rope_scaling"] == "none" else f"{row['rope_scaling']} x{row['rope_factor']:g}"
        cells.append(f"{name} " + " / ".join(f"{m:.3f}" for m in means))
    return (f"RoPE scaled at evaluation, no training (`positions-ptb-char-3000/rope-scaling.json`, {len(seeds)} seeds,"
            f" bpc at memory {' / '.join(map(str, data['contexts']))}): " + "; ".join(cells) + ".")  # fmt: skip


def block_section() -> list[str]:
    xl = test_stats("compaction-ptb-char-3000", "xl")
    rows = []
    for (store, name), label in BLOCK.items():
        if not seed_paths(store, name):
            continue
        runs, s = seeds(store, name), test_stats(store, name)
        curve = [memory_curve(runs, m) for m in (128, 256, 512)]
        rows.append([label, num(runs[0]["params"]), spread(s, ranges=False), versus(name, "xl", xl, s), *curve])
    header = ["model", "params", "char PTB bpc ↓", "vs XL", "eval mem 128", "256", "512"]
    body = [
        "Each with base.toml's memory of 128 (trained), 3,000 steps of 16 x 64; the GPT 1,000 steps of 16 x 192 (equal"
        " tokens). Test bpc; then bpc with evaluation memories of 1x, 2x and 4x the training memory (same_length).",
        "",
        *table(header, rows, "lrllrrr"),
        "",
        rope_scaling_line(),
        "",
        wt2_block_line(),
    ]
    study = load("positions-ptb-char-3000/study.json")
    return section(
        "Positions and today's block (Table 6 form)", study, body, "positions-ptb-char-3000/, block-ptb-char-3000/"
    )


COMPACTION = {"xl": "XL: 128 slots", "compress-max": "compressive, max: 64 + 32 (c = 2)",
              "compress-mean": "compressive, mean: 64 + 32", "xl-pruned": "pruned by attention: 128",
              "xl-int8": "8-bit: 128 slots", "compress-conv": "compressive, conv: 64 + 32",
              "compress-linear": "compressive, linear W_m: 64 + 32",
              "mem-tokens": "memory tokens: 128 + 8 tokens, BPTT 2"}  # fmt: skip


def memory_bytes(run: dict) -> int:
    """Bytes of one layer's memory for one stream, memory full: float32 slots, or int8 with a float scale a slot."""
    model, memory = run["model"], run["model"]["memory"]
    slots = memory["mem_len"] + memory["cmem_len"] + memory["mem_tokens"]
    per_slot = model["d_model"] + 4 if memory["mem_quant"] == "int8" else 4 * model["d_model"]
    return slots * per_slot


def compaction_section() -> list[str]:
    store = "compaction-ptb-char-3000"
    base = test_stats(store, "xl")
    rows = []
    for name, label in COMPACTION.items():
        s = test_stats(store, name)
        rows.append([label, num(memory_bytes(seeds(store, name)[0]["run"])), spread(s, ranges=False),
                     ", ".join(f"{v:.4f}" for v in s["values"]), versus(name, "xl", base, s)])  # fmt: skip
    body = [
        "Each row reaches 128 positions back a layer; bytes: a layer's full memory, one stream. 3 seeds, 3,000 steps.",
        "",
        *table(["memory per layer", "bytes ↓", "test bpc ↓", "seeds 1, 2, 3", "vs XL"], rows, "lrlll"),
    ]
    return section("Memory compaction ablation", load(f"{store}/study.json"), body, f"{store}/")


def clamp_rows(name: str, corpus: str) -> list[list]:
    """Per reading, per seed: the loss at twice the training memory minus the loss at the training memory."""
    rows = []
    for key, reading in (("same_length", "same_length"), ("same_length_clamped", "same_length, clamp_len 192"),
                         ):  # fmt: skip
        diffs = []
        for r in load(f"context-clamp/{name}"):
            at = dict(zip(r["memory"] if key == "not_same_length" else r["contexts"], r[key]))
            diffs.append(f"{at[2 * r['train_mem_len']] - at[r['train_mem_len']]:+.5f}")
        rows.append([corpus, reading, *diffs])
    return rows


def clamp_section() -> list[str]:
    rows = clamp_rows("ptb-char-3000.json", "char PTB, bpc") + clamp_rows("wt2-word-3000.json", "WikiText-2, bits")
    body = [
        "XL trained with mem_len 128: bits with memory 256 minus with 128 (negative: twice the memory helps):",
        "",
        *table(["corpus", "evaluation", "seed 1", "seed 2", "seed 3"], rows, "llrrr"),
    ]
    return section("Twice the training memory at evaluation", load("context-clamp/study.json"), body, "context-clamp/")


MIXERS = {"xl": "XL (attention)", "no-memory": "no memory", "ssm": "ssm (4 state-space layers)",
          "hybrid": "ssm, attention, ssm, attention", "conv-attn": "conv, attention, conv, attention",
          "rnn": "rnn (4 LSTM mixers)", "hourglass": "hourglass (2 of 4 layers at 1/2)"}  # fmt: skip


LINEAR = {"gla": "gla (gated linear attention)", "retention": "retention (RetNet)",
          "linear": "linear (elu+1, restarted every 64, rotary)",
          "performer": "performer (FAVOR+, 64 features; as linear)", "delta-noconv": "delta, no short conv",
          "delta": "delta (DeltaNet, short conv)", "gla-conv": "gla, short conv"}  # fmt: skip


def few_seeds(s: dict) -> str:
    """``spread`` without ranges, naming the seeds where they are not the table's 3."""
    return spread(s, ranges=False) + (f" ({s['n']} seeds)" if s["n"] not in (1, 3) else "")


def linear_rows() -> list[list[str]]:
    """The linear-attention family on character PTB against its store's XL, and on WikiText-2 (where run) against
    the mixers' XL."""
    store = "linear-ptb-char-3000"
    base, base_w = test_stats(store, "xl"), test_stats("wt2-word-3000", "xl")
    rows = []
    for name, label in LINEAR.items():
        if not seed_paths(store, name):
            continue  # not run yet
        s = test_stats(store, name)
        words = ["not run", "", ""]
        if seed_paths("wt2-word-3000", name):
            w, ppl = test_stats("wt2-word-3000", name), test_stats("wt2-word-3000", name, "ppl")["mean"]
            words = [few_seeds(w), f"{ppl:.1f}", versus(name, "xl", base_w, w)]
        rows.append([label, few_seeds(s), versus(name, "xl", base, s), *words])
    return rows


def mixers_section() -> list[str]:
    char = load("mixers-ptb-char-3000/summary.json")["variants"]
    base_c, base_w = char["xl"]["test_bpc"], test_stats("wt2-word-3000", "xl")
    rows = []
    for name, label in MIXERS.items():
        w, ppl = test_stats("wt2-word-3000", name), test_stats("wt2-word-3000", name, "ppl")["mean"]
        c = char[name]["test_bpc"] if name in char else None
        char_cells = ["not run", ""] if c is None else [spread(c, ranges=False), versus(name, "xl", base_c, c)]
        rows.append([label, *char_cells, spread(w, ranges=False), f"{ppl:.1f}", versus(name, "xl", base_w, w)])
    rows += linear_rows()
    body = [
        "d_inner gives each stack XL's parameters (863k on characters, 5.15M on words); 3 seeds, 3,000 steps.",
        "Linear-attention rows (issue 42): char PTB against `linear-ptb-char-3000/`'s XL (1.9830, same base and"
        " steps); its README has the unbounded linear (3.4467, the bigram).",
        "",
        *table(["stack", "char PTB bpc ↓", "vs XL", "WikiText-2 bits/word ↓", "ppl", "vs XL"], rows, "lllllr"),
    ]
    study = load("mixers-ptb-char-3000/study.json")
    study = {
        **study,
        "date": "2026-12-01/02",
        "commands": [*study["commands"], load("wt2-word-3000/study.json")["commands"][0]],
    }
    return section("Mixers at equal parameters", study, body, "mixers-ptb-char-3000/, wt2-word-3000/")


LISTOPS = {"stop-gradient": ("stop-gradient (paper)", "final segment"),
           "mem-bptt-8": ("through 8 segments", "final segment"),
           "document-pooling": ("through 8 segments", "whole document")}  # fmt: skip


def listops_section() -> list[str]:
    rows = []
    for folder, (gradient, pooling) in LISTOPS.items():
        r = load(f"listops/{folder}/result.json")
        reload = r["reload"]
        same = "equal" if reload["same"] else "DIFFERENT"
        buckets = [pct(b["accuracy"], 1) for b in r["test"]["by_length"].values()]
        rows.append([gradient, pooling, f"**{pct(r['test']['accuracy'])}**", *buckets,
                     f"{pct(reload['valid_accuracy_reloaded'])} ({same})", pct(r["finetune"]["train"]["accuracy"])])  # fmt: skip
    lengths = list(load("listops/mem-bptt-8/result.json")["test"]["by_length"])
    body = [
        "2 layers, d_model 64, memory 2,048, 5,000 steps; accuracy ↑ (test by length in tokens; valid: reloaded).",
        "LRA: Transformer 36.4%, BigBird 36.1%; target 37%; majority class 15.95%.",
        "",
        *table(["memory gradient", "pooling", "test", *lengths, "valid (reload)", "train"], rows, "llrrrrrr"),
    ]
    return section("LRA ListOps", load("listops/study.json"), body, "listops/")


RECALL_ROWS = ["xl-mem0", "xl-mem64", "xl-mem256", "window", "mem-tokens-bptt", "compressed", "xl-int8", "ssm",
               "hybrid", "rnn", "hourglass", "gla", "retention", "linear", "linear-unbounded", "attention",
               "conv"]  # fmt: skip
RECALL_PASSKEY = [64, 256, 1024, 4096]  # the passkey distances shown


def recall_runs(task: str, variant: str) -> list[dict]:
    """The stored seeds of one recall row (none yet: an empty list)."""
    paths = sorted(glob.glob(os.path.join(RESULTS, "recall", task, variant, "seed*.json")))
    return [load(os.path.relpath(path, RESULTS)) for path in paths]


def recall_mean(runs: list[dict], axis: str, value: int) -> float | None:
    values = [c["accuracy"] for r in runs for c in r["cells"] if c.get(axis) == value]
    return sum(values) / len(values) if values else None


def passkey_edge(runs: list[dict]) -> str:
    """The longest distance up to which every distance measured is >= 99% (mean over seeds), or "none"."""
    distances = sorted({c["distance"] for r in runs for c in r["cells"]})
    edge = None
    for d in distances:
        if recall_mean(runs, "distance", d) < 0.99:
            break
        edge = d
    return "none" if edge is None else str(edge)


def recall_row(variant: str) -> list | None:
    passkey, cells = recall_runs("passkey", variant), []
    if passkey:
        attends = "attention" in passkey[0]["settings"].get("mixer", ["attention"])  # else mem_len is not read
        reach = passkey[0]["effective_range"] if attends else 0
        cells += [f"{len(passkey)}", num(reach) if reach else "—", passkey_edge(passkey),
                  *[f"{100 * recall_mean(passkey, 'distance', d):.0f}%" for d in RECALL_PASSKEY]]  # fmt: skip
    else:
        cells += ["", "", "", *[""] * len(RECALL_PASSKEY)]
    for task, length in (("induction", 256), ("induction", 65536), ("copying", 256), ("mqar", 64)):
        runs = recall_runs(task, variant)
        mean = recall_mean(runs, "length", length) if runs else None
        cells.append("" if mean is None else f"{100 * mean:.1f}% ({len(runs)})")
    return None if not any(cells) else [variant, *cells]


def recall_section() -> list[str]:
    rows = [row for row in map(recall_row, RECALL_ROWS) if row]
    head = ["model", "seeds", "reach", "≥99% to", *[f"pk {d}" for d in RECALL_PASSKEY], "ind. 256", "ind. 2^16",
            "copy", "MQAR"]  # fmt: skip
    body = [
        "Accuracy ↑, mean over (seeds); 2 layers, d_model 64, segments of 64, memory carried. Passkey (pk: distance,",
        "chance 10%, trained at 1-254): reach = as reported; ≥99% to = measured edge. Papers: Mamba copying S6 99.8%",
        "(4,096 tokens; ours 256), induction 100% to 2^20; Zoology MQAR: attention ~100%. Induction, copying, MQAR:",
        "not learned here (chance 6.7%, 7.1%, 25%) after every try, up to 30k steps: `recall/README.md`.",
        "",
        *table(head, rows, "lrrrrrrrrrrr"),
        "",
        mqar_pairs_line(),
    ]
    return section("What each architecture remembers (recall)", load("recall/study.json"), body, "recall/")


def mqar_pairs_line() -> str:
    """Zoology's MQAR sweep (``recall-linear/``): the median accuracy over seeds by number of pairs, per row (a
    seed stuck on MQAR's plateau makes a row bimodal, which a mean would hide)."""
    points: dict[str, dict[int, list[float]]] = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "recall-linear", "*", "pairs*-seed*.json"))):
        point = load(os.path.relpath(path, RESULTS))
        points.setdefault(point["row"], {}).setdefault(point["n_pairs"], []).append(100 * point["accuracy"])
    pairs = sorted({p for by in points.values() for p in by})
    seeds = min(len(v) for by in points.values() for v in by.values())
    cells = "; ".join(
        f"{row} {' / '.join(f'{statistics.median(by[p]):.0f}' for p in pairs)}" for row, by in points.items()
    )
    return (
        f"MQAR by pairs (`recall-linear/`: Zoology's sweep, `[conv, X, X]`, 2,048 numbers of state a layer), median"
        f" of {seeds} seeds, % at {' / '.join(map(str, pairs))} pairs: {cells}."
    )


CHUNK_CORPORA = {"shakespeare-bytes": "tiny-shakespeare", "ptb-bytes": "PTB", "wt2-bytes": "WikiText-2"}
CHUNKS = {"bytes-xl": "byte XL", "bytes-fixed": "fixed hourglass (groups of 4)",
          "bytes-learned": "learned chunks (H-Net routing, target 4)", "bpe-xl": "BPE XL (1,024 tokens)"}  # fmt: skip


def chunk_cell(store: str, name: str) -> tuple[str, str]:
    """One model's bits per byte on one corpus with its gap to byte XL, and its mean chunk length (or "")."""
    runs, s = seeds(store, name), test_stats(store, name, "bpb")
    gap = versus(name, "bytes-xl", test_stats(store, "bytes-xl", "bpb"), s)
    chunk = [r["chunks"]["mean_length"] for r in runs if r.get("chunks")]
    return ", ".join(filter(None, [spread(s, ranges=False), gap])), f"{sum(chunk) / len(chunk):.2f}" if chunk else ""


def chunks_section() -> list[str]:
    """Issue 43's study: bits per byte at equal training FLOPs, a column per corpus stored so far."""
    corpora = [c for c in CHUNK_CORPORA if seed_paths(f"learned-chunks-flops/{c}", "bytes-xl")]
    rows = []
    for name, label in CHUNKS.items():
        cells = [chunk_cell(f"learned-chunks-flops/{c}", name) for c in corpora]
        first, *others = (seeds(f"learned-chunks-flops/{c}", name)[0] for c in corpora)
        if any((o["step"], o["params"]) != (first["step"], first["params"]) for o in others):
            raise SystemExit(f"{name} trains other steps or parameters on another corpus: one row cannot say both")
        rows.append([label, num(first["step"]), num(first["params"]), *(c for c, _ in cells),
                     " / ".join(length for _, length in cells if length)])  # fmt: skip
    body = [
        "Test bits per byte ↓ over the whole test split, and the gap to byte XL; each model trains the steps that"
        " spend 2.4e13 FLOPs; mean chunk in bytes on 16,384 test bytes, per corpus. Passkey reach at the same"
        " mem_len: `learned-chunks-flops/README.md`.",
        "",
        *table(
            ["model", "steps", "params", *(CHUNK_CORPORA[c] for c in corpora), "chunk"],
            rows,
            "lrr" + "l" * len(corpora) + "r",
        ),  # fmt: skip
    ]
    study = {"machine": "dev-cpu (one thread a run)", "date": "2026-12-06",
             "commands": ["python benchmarks/studies/runner.py --data-root ../shared/data --corpus CORPUS"
                          " --out runs/chunks-CORPUS --store benchmarks/results/learned-chunks-flops/"
                          "CORPUS --flops 2.4e13 --seeds 1 2 3 --baseline bytes-xl --variants bytes-xl"
                          " bytes-fixed bytes-learned bpe-xl --test-segments 100 --recl-tokens 10000 --resume"]}  # fmt: skip
    return section("Learned segmentation at equal FLOPs", study, body, "learned-chunks-flops/")


PRESET = {"no-memory": "no memory", "xl": "XL, mem_len 128", "preset": "the old preset: XL, mem_len 64",
          "preset-curriculum": "curriculum (0 to 64 in 800 steps)",
          "preset-recipe": "curriculum, R whole: the preset now"}  # fmt: skip


def preset_section() -> list[str]:
    variants = load("preset-tiny-shakespeare-1200/summary.json")["variants"]
    old = variants["preset"]["test_bpc"]["mean"]
    rows = [[label, spread(variants[name]["test_bpc"], ranges=False),
             "" if name == "preset" else f"{variants[name]['test_bpc']['mean'] - old:+.3f}"]
            for name, label in PRESET.items()]  # fmt: skip
    run = load("preset-tiny-shakespeare-1200/default-run.json")
    first = [[r["figure"], r["now"], r["before"], r["ratio"]] for r in run["rows"] if r["on_page"]]
    body = [
        *table(["`longseq train`, 1,200 steps", "the preset now", "before the recipe", "ratio"], first, "lrrr"),
        "",
        "The recipe on the preset itself, before it became the default (test bpc ↓, 3 seeds):",
        "",
        "```bash",
        *load("preset-tiny-shakespeare-1200/study.json")["commands"],
        "```",
        "",
        *table(["variant", "test bpc", "vs the old preset"], rows, "llr"),
    ]
    return section("The default preset's recipe", run, body, "preset-tiny-shakespeare-1200/")


def mfu_section() -> list[str]:
    data = load("speed/mfu.json")
    share = lambda v: "" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    settings = [[r["setting"], num(r["tokens_per_s"]), f"{r['mfu']:.2f}", share(r["matmul_share"]),
                 "" if r["matmul_efficiency"] is None else f"{r['matmul_efficiency']:.2f}"] for r in data["settings"]]  # fmt: skip
    top = sorted(data["breakdown"]["rows"][1:], key=lambda r: -r["share"][-1])[:2]  # after the matmuls
    after = ", ".join(f"{r['kind'].split(' (')[0]} {r['share'][-1]:.0f}%" for r in top)
    body = [
        "MFU ↑: the model's matmul FLOPs per token x tokens/s over a 1,024 float32 matmul probe of the same run.",
        "",
        *table(["setting", "tokens/s", "MFU", "matmul share", "matmul efficiency"], settings, "lrrrr"),
        "",
        f"At 512/512, after the matmuls: {after} of the step (profiler).",
    ]
    return section("Model FLOPs utilisation of a training step", data, body, "speed/mfu.json")


def trees_line() -> str:
    """The latest session's trees against its start (``compare_trees.py``): train, eval, generate tokens/s, B over
    A (the earlier comparisons: speed/README.md)."""
    ratio = {r["figure"]: r["b_over_a"] for r in load("speed/trees-session-1206c.json")["rows"]}
    train, evaluate, generate = (ratio[f"bench {task}: tokens_per_s"] for task in ("train", "eval", "generate"))
    return (f"12-06c (`speed/trees-session-1206c.json`): train {train:.2f}x, eval {evaluate:.2f}x, generate"
            f" {generate:.2f}x")  # fmt: skip


def smaller_section() -> list[str]:
    """The smaller measurements, one line each with its key figures; their tables are in the JSON each names (FSDP,
    FlexAttention on a CPU, prepared corpora and tables through datasets: speed/README.md)."""
    a, t, noise = (
        load(f"speed/{name}.json") for name in ("activation-checkpointing", "tokenizers-wt2", "dropout-noise")
    )
    ms = noise["median_ms"]
    every = [r for r in a["rows"] if r["every"] == "1"][-1]
    bpc = {r["tokenizer"]: r["test_bpc"] for r in t["rows"]}
    ba = {r["figure"]: r["ratio"] for r in load("speed/before-after.json")["rows"]}
    lines = [
        f"* **Before and after** (tokens/s): the GPU-ready step (`speed/before-after.json`): "
        f"{ba['training tokens/s ↑, eager']:.2f}x eager, {ba['training tokens/s ↑, compiled']:.2f}x compiled "
        f"(compile time {ba['compile s ↓']:.2f}x); {trees_line()}.",
        f"* **Activation checkpointing** (`speed/activation-checkpointing.json`): every layer recomputed at "
        f"{num(every['length'])} tokens: {every['time_vs_off']:.2f}x time, {every['memory_vs_off']:.2f}x memory.",
        f"* **Dropout masks** (`speed/dropout-noise.json`, {' x '.join(map(str, noise['shape']))}, p = {noise['p']}):"
        f" 15 bits a decision {ms['bits15']:.2f} ms, 31 bits {ms['bits31']:.2f} ms"
        f" ({noise['bits31_over_bits15']:.2f}x).",
        f"* **Tokenizers on WikiText-2** (`speed/tokenizers-wt2.json`, equal tokens): test bpc: byte "
        f"{bpc['byte']:.3f}, char {bpc['char']:.3f}, BPE {bpc['bpe']:.3f}, word {bpc['word']:.3f}.",
    ]
    return ["## Smaller measurements", f"*{MACHINE.split(':')[0]}; commands in each JSON*", "", *lines, ""]


XT_ROWS = [  # (longseq row, peer row, label): the equal-settings pair first
    ("longseq_rope", "xt_rotary_mem", "rope vs xt rotary"),
    ("longseq_rope", "xt_rotary_flash_mem", "rope vs xt rotary flash"),
    ("longseq", "xt_rotary_mem", "paper block vs xt rotary"),
    ("longseq_llama", "longseq_llama_gpt", "llama-xl vs its no-memory GPT"),
]


def xt_rss_line() -> str:
    """Peak RSS of a training step beside x-transformers, each variant alone in its process."""
    data = load("speed/vs-x-transformers-rss.json")
    cells = []
    for precision in ("fp32",):  # bf16's: the JSON
        for size, rows in data[precision].items():
            mib = {name: row["step_rss_mb"] for name, row in rows.items()}
            cells.append(f"{precision} {size} {num(mib['longseq_rope'])} vs {num(mib['xt_rotary_mem'])} /"
                         f" {num(mib['xt_rotary_flash_mem'])} ({num(mib['longseq'])})")  # fmt: skip
    return (
        "Peak RSS of a step, MiB above imports (`vs_x_transformers.py --rss-only --steps 2 --threads 1"
        " [--autocast bf16]`: a process per variant; bf16 in `speed/vs-x-transformers-rss.json`), rope vs"
        " x-transformers rotary / flash (paper block): " + "; ".join(cells) + "."
    )


def xt_cpu_section() -> list[str]:
    """Training speed beside x-transformers on this CPU, fp32 and bf16 autocast (issue 45)."""
    rows = []
    for (ours, peer, label), precision in ((r, p) for r in XT_ROWS for p in ("fp32", "bf16")):
        for size in load(f"speed/vs-x-transformers-cpu-{precision}.json")["sizes"]:
            tps = size["tokens_per_s"]
            if peer in tps:
                rows.append([label, precision, f"{size['tgt_len']} / {size['mem_len']}", num(tps[ours]),
                             num(tps[peer]), f"**{tps[ours] / tps[peer]:.2f}x**"])  # fmt: skip
    body = [
        "Training tokens/s, batch 8, medians of alternating rounds (fp32: a process per round; bf16: one process);"
        " xt: x-transformers 2.31, at equal settings for the rope rows (all 32 channels rotated on both sides,"
        " dropout at the same sites). The GPT (context tgt + mem) counts tokens of its context; why it leads, the"
        " day's other sittings (128/128: 1.13-1.25x) and the studies' sizes: `speed/README.md`.",
        "",
        *table(["comparison", "dtype", "tgt / mem", "longseq", "peer", "ratio"], rows, "lllrrr"),
        "",
        xt_rss_line(),
    ]
    return section("Speed against x-transformers (CPU)", load("speed/vs-x-transformers-cpu.json"), body, "speed/")


def gpu_section() -> list[str]:
    """The first GPU session: training speed beside HF TransfoXL and x-transformers, and what the check saw."""
    study, hf, check = load("gpu/study.json"), load("gpu/vs-hf.json")["sections"], load("gpu/gpu-check.json")
    ratio = hf["hf_ratio"]
    rows = [["HF TransfoXL", "fp32", "512 / 512", num(ratio["longseq_tokens_per_s"]), num(ratio["hf_tokens_per_s"]),
             f"**{ratio['speedup']:.2f}x**"]]  # fmt: skip
    names = {"xt_rotary_mem": "x-transformers rotary", "xt_rotary_flash_mem": "x-transformers rotary flash"}
    for precision in ("fp32", "bf16"):
        for size in load(f"gpu/vs-x-transformers-{precision}.json")["sizes"]:
            tps, where = size["tokens_per_s"], f"{size['tgt_len']} / {size['mem_len']}"
            rows += [[names[n], precision, where, num(tps["longseq"]), num(tps[n]), f"**{size['longseq_over'][n]:.2f}x**"]
                     for n in names if size["tgt_len"] == 512 or (n, precision) == ("xt_rotary_mem", "fp32")]  # fmt: skip
    s = check["sections"]
    syncs = ", ".join(f"{k} {v}" for k, v in s["host_syncs"]["syncs_per_forward_backward"].items())
    body = ["Training tokens/s, batch 8, medians of 3 alternating rounds (launch-bound; rounds differ by "
            "up to 15%). Checks and what waits for a GPU: `gpu/README.md`.", "",
            *table(["peer", "dtype", "tgt / mem", "longseq", "peer", "ratio"], rows, "lllrrr"),
            "", f"bf16 vs fp32 (window, 8k): {s['bf16_vs_fp32']['speedup']:.2f}x; host syncs per step "
            f"(expected 0): {syncs}."]  # fmt: skip
    return section("On an H200", study, body, "gpu/")


def pretrained_section() -> list[str]:
    """SmolLM2-135M-Instruct (GGUF) imported by longseq convert, against transformers' own model on the file."""
    study, r = load("pretrained/study.json"), load("pretrained/smollm2.json")
    ids, first, ev, greedy = r["token_ids"], r["first_tokens"], r["longseq_eval"], r["greedy"]
    same = lambda flag: "identical" if flag else "differ"  # noqa: E731
    rows = [[f"WikiText-2 test token ids ({num(ids['tokens'])})", same(ids["identical"]), ""],
            [f"test perplexity, first {num(ev['tokens'])} predictions", f"{ev['perplexity']:.4f}",
             f"{first['transformers_perplexity']:.4f}"],
            [f"max abs logit difference, {num(first['forward_s']['tokens'])} tokens",
             f"{first['max_abs_logit_difference']:.1e}", f"(logits to {first['max_abs_logit']:.1f})"],
            [f"{greedy['tokens']} greedy tokens", same(greedy["identical"]), ""]]  # fmt: skip
    body = [f"Q4_1, {r['parameters'] / 1e6:.1f}M parameters, float32; `longseq eval` (segments of 512, memory "
            f"carried) against one transformers {r['transformers']} pass. Convert: {r['convert_s']:.0f} s, "
            f"{num(r['convert_peak_rss_mib'])} MiB peak RSS. docs/pretrained.md.", "",
            *table(["measure", "longseq", "transformers"], rows, "lrr")]  # fmt: skip
    return section("SmolLM2-135M-Instruct imported", study, body, "pretrained/")


def render() -> str:
    """The whole page."""
    parts = [headline(), memory_section(), hf_section(), vanilla_section(), patterns_section(), table6_section(),
             block_section(), compaction_section(), clamp_section(), mixers_section(), mixers_speed_section(), listops_section(),
             recall_section(), chunks_section(),
             pretrained_section(), preset_section(), xt_cpu_section(), mfu_section(), gpu_section(),
             smaller_section()]  # fmt: skip
    return "\n".join(line for part in parts for line in part).rstrip("\n") + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when BENCHMARKS.md differs from the results")
    parser.add_argument("--out", default=PAGE, help="where to write the page (default: BENCHMARKS.md)")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            current = f.read()
        if current != page:
            diff = difflib.unified_diff(current.splitlines(), page.splitlines(), "BENCHMARKS.md", "from the results",
                                        lineterm="", n=0)  # fmt: skip
            sys.stdout.write("\n".join(list(diff)[:40]) + "\n")
            raise SystemExit("BENCHMARKS.md differs from the stored results: run benchmarks/tools/results_page.py")
        return
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"wrote {args.out} ({len(page.encode())} bytes)")


if __name__ == "__main__":
    main()
