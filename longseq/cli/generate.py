"""``longseq generate``: sample a continuation of a prompt with the recurrence memory.

Tokens are printed as they are drawn (flushed), so an interrupted run keeps what it sampled, and the text ends with
a newline (one is added unless it ends with one), so a shell prompt or the next command's output starts on a line of
its own; ``--json`` prints one object at the end (also when interrupted, with ``"interrupted": true``)."""

from __future__ import annotations

import argparse
import json
import time

from longseq.cli.common import common_flags, device_flag, load_model, refuse_memory_settings, say


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="sample a continuation of a prompt")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory, or a run directory (uses best/)")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0 for greedy decoding")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mem-len", type=int, help="memory length while sampling (default: train mem_len + tgt_len)")
    device_flag(p)
    return common_flags(p)


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt's ids; a word prompt not ending in a newline does not end its line (no <eos>).  Unknown words
    are named on stderr."""
    ids = tokenizer.encode_prompt(prompt).tolist()
    if tokenizer.kind == "word":
        words = [w.lower() if tokenizer.lowercase else w for w in prompt.split()]
        unknown = sorted({w for w in words if w not in tokenizer.index})
        if unknown:
            say(
                f"warning: {len(unknown)} prompt word(s) are not in the vocabulary and read as <unk>: "
                + ", ".join(repr(w) for w in unknown[:10])
            )
    if not ids:
        raise ValueError("the prompt is empty; give at least one character or word")
    return ids


class StreamText:
    """Decoded text of a growing id sequence, printed as soon as it is complete (a byte tokenizer may need several
    bytes for one character)."""

    def __init__(self, tokenizer, prompt: list[int], shown_prompt: str) -> None:
        self.tokenizer, self.pending, self.text = tokenizer, [], ""
        joint = tokenizer.decode(prompt)
        gap = joint[len(joint.rstrip()) :]  # words are separated by a space the prompt may not end with
        self.lead = "" if shown_prompt.endswith(gap) else gap

    def feed(self, token: int) -> str:
        self.pending.append(token)
        text = self.tokenizer.decode(self.pending)
        if text.endswith("\ufffd") and len(self.pending) < 4:  # an unfinished UTF-8 character: wait for its bytes
            return ""
        self.pending = []
        return self._emit(text)

    def flush(self) -> str:
        text, self.pending = self.tokenizer.decode(self.pending) if self.pending else "", []
        return self._emit(text)

    def _emit(self, text: str) -> str:
        if self.lead and text:
            text, self.lead = self.lead + text, ""
        self.text += text
        return text


def run(args: argparse.Namespace) -> dict:
    import torch

    from longseq.config import Recurrence
    from longseq.generation import check_sampling, generate_stream

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    if args.mem_len is not None:
        Recurrence(args.mem_len)  # checks it (>= 0) before the checkpoint loads and the prompt is printed
    _, model, tokenizer, run_config = load_model(args.checkpoint, args.device)
    if run_config.task is not None:
        raise ValueError(f"{args.checkpoint} is fine-tuned for {run_config.task.name}; use longseq predict")
    refuse_memory_settings(run_config.model, ["--mem-len"] if args.mem_len is not None else [])
    ids = prompt_ids(tokenizer, args.prompt)
    mem_len = args.mem_len if args.mem_len is not None else run_config.model.memory.mem_len + run_config.data.tgt_len
    stream = StreamText(tokenizer, ids, args.prompt)
    tokens = generate_stream(
        model,
        torch.as_tensor(ids)[None],
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        recurrence=run_config.model.recurrence(mem_len=mem_len),
        segment_len=run_config.data.tgt_len,
        generator=torch.Generator(device=next(model.parameters()).device).manual_seed(args.seed),
    )
    start, count, interrupted = time.perf_counter(), 0, False
    if not args.json:
        print(args.prompt, end="", flush=True)
    try:
        for token in tokens:
            count += 1
            piece = stream.feed(int(token[0, 0]))
            if piece and not args.json:
                print(piece, end="", flush=True)
    except KeyboardInterrupt:
        interrupted = True
    tail = stream.flush()
    elapsed = time.perf_counter() - start
    result = {"prompt": args.prompt, "text": stream.text, "tokens": count, "tokens_per_s": count / max(elapsed, 1e-9)}
    if args.json:
        print(json.dumps({**result, **({"interrupted": True} if interrupted else {})}, sort_keys=True), flush=True)
    else:  # the streamed text ends its line
        print(tail, end="" if (args.prompt + stream.text).endswith("\n") else "\n", flush=True)
    if interrupted:
        raise KeyboardInterrupt
    return {}  # the result is printed above, as it streamed
