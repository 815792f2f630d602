"""``longseq generate``: sample a continuation of a prompt with the recurrence memory.

Tokens are printed as they are drawn (flushed), so an interrupted run keeps what it sampled, and the text ends with
a newline (one is added unless it ends with one), so a shell prompt or the next command's output starts on a line of
its own; ``--json`` prints one object at the end (also when interrupted, with ``"interrupted": true``).

``--prompt FILE`` with a file of a format a reader claims (audio: ``.wav``, ``.flac``, ``.ogg``) reads the file through
that reader; a tokenizer with a start of its own (``mulaw``: a clip start) needs no prompt.  ``--out FILE`` writes
the prompt and its continuation through the tokenizer (``mulaw``: a playable 16 kHz WAV) instead of printing them."""

from __future__ import annotations

import argparse
import json
import time

from longseq.cli.common import (
    checkpoint_kind,
    common_flags,
    device_flag,
    load_model,
    refuse_memory_settings,
    say,
    set_threads,
    threads_flag,
)


def check_writable(path: str) -> None:
    """``--out``'s directory exists (checked before the model loads and anything is sampled)."""
    import os

    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"--out {path}: the directory {directory} does not exist")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="sample a continuation of a prompt")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory, or a run directory (uses best/)")
    p.add_argument(
        "--prompt",
        help="text to continue, or a file a reader claims (audio: FILE.wav); optional for a tokenizer with a start of "
        "its own (mulaw)",
    )
    p.add_argument("--out", metavar="FILE", help="write the prompt and its continuation here (mulaw: FILE.wav)")
    p.add_argument("--plot", metavar="FILE.png", help="with --out audio: draw its waveform and spectrogram")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0 for greedy decoding")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mem-len", type=int, help="memory length while sampling (default: train mem_len + tgt_len)")
    p.add_argument(
        "--sinks",
        type=int,
        help="keep the prompt's first K tokens in the memory for ever beside the last --mem-len (attention sinks: "
        "a pretrained model generating past its context; default: the checkpoint's, 0)",
    )
    p.add_argument("--sink-positions", choices=("cache", "text"), help="where rope places the sinks (default cache)")
    p.add_argument(
        "--chat",
        action="store_true",
        help="a pretrained model's chat: the prompt as a user message through its chat template, stopping at its "
        "end-of-text token (needs transformers)",
    )
    device_flag(p)
    threads_flag(p)
    return common_flags(p)


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """The ids of ``prompt`` as a user message in the checkpoint's chat template, the assistant's turn opened."""
    from longseq.data.tokenizers import PretrainedTokenizer
    from longseq.interop.llama_tokenizer import chat_text

    if not isinstance(tokenizer, PretrainedTokenizer) or not tokenizer.chat_template:
        raise ValueError(
            f"--chat needs a pretrained model's chat template; this checkpoint's {tokenizer.kind} tokenizer has none"
        )
    return tokenizer.encode(chat_text(tokenizer, [{"role": "user", "content": prompt}])).tolist()


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt's ids (``encode_prompt``): a word prompt not ending in a newline does not end its line (no <eos>);
    a pretrained tokenizer's come after what it puts before a text (``start_ids``: a BOS).  Unknown words are named
    on stderr."""
    ids = [*tokenizer.start_ids(), *tokenizer.encode_prompt(prompt).tolist()]
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


def prompt_text(tokenizer, prompt: str | None) -> str:
    """The text to continue: ``prompt``, the text of the file it names where a reader other than plain text claims
    the file's ending (audio), or the tokenizer's own start where none is given."""
    import os

    from longseq.data.readers import ReadOptions, Tap, reader_for

    if prompt is None:
        if tokenizer.start_text is None:
            raise ValueError(f"a {tokenizer.kind} model needs --prompt: its tokenizer has no start of its own")
        return tokenizer.start_text
    reader = reader_for(prompt, ReadOptions())
    if reader.name == "plain" or not os.path.isfile(prompt):
        return prompt
    with open(prompt, "rb") as f:
        return "".join(reader.text_blocks(prompt, Tap(f)))


def plot_audio(path: str, out: str, prompt_tokens: int) -> str:
    """The waveform and spectrogram of the audio written to ``path``, a line where the prompt ends."""
    from longseq.data.audio import read_audio
    from longseq.diagnostics.plots import plot_waveform

    with open(path, "rb") as f:
        samples, rate = read_audio(f.read(), path)
    prompt = max(prompt_tokens - 1, 0) / rate  # the prompt's clip start is no sample
    return plot_waveform(samples[:, 0], rate, out, mark=prompt if prompt_tokens > 1 else None)


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

    set_threads(args)
    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    if args.mem_len is not None or args.sinks is not None:  # checked before the checkpoint loads, the prompt shows
        Recurrence(args.mem_len or 0, sinks=args.sinks or 0)
    _, model, tokenizer, run_config = load_model(args.checkpoint, args.device)
    if not run_config.is_language_model:
        raise ValueError(f"{args.checkpoint} is not a language model: it is {checkpoint_kind(run_config)}")
    flags = ("--mem-len", "--sinks", "--sink-positions")
    refuse_memory_settings(run_config.model, [f for f in flags if getattr(args, f[2:].replace("-", "_")) is not None])
    if args.plot and not (args.out and args.out.lower().endswith((".wav", ".flac"))):
        raise ValueError("--plot draws the audio of --out FILE.wav; give --out")
    if args.out:
        check_writable(args.out)
    text = prompt_text(tokenizer, args.prompt)
    ids = chat_ids(tokenizer, text) if args.chat else prompt_ids(tokenizer, text)
    stop = tokenizer.eos_id if args.chat else None
    mem_len = args.mem_len if args.mem_len is not None else run_config.model.memory.mem_len + run_config.data.tgt_len
    stream = StreamText(tokenizer, ids, text)
    shown = "" if args.out else text
    tokens = generate_stream(
        model,
        torch.as_tensor(ids)[None],
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        recurrence=run_config.model.recurrence(mem_len=mem_len, sinks=args.sinks, sink_positions=args.sink_positions),
        segment_len=run_config.data.tgt_len,
        generator=torch.Generator(device=next(model.parameters()).device).manual_seed(args.seed),
    )
    start, count, interrupted, drawn = time.perf_counter(), 0, False, []
    if not args.json:
        print(shown, end="", flush=True)
    try:
        for token in tokens:
            if int(token[0, 0]) == stop:  # the chat's turn ends
                break
            count += 1
            drawn.append(int(token[0, 0]))
            piece = stream.feed(drawn[-1])
            if piece and not args.json and not args.out:
                print(piece, end="", flush=True)
    except KeyboardInterrupt:
        interrupted = True
    tail = stream.flush()
    elapsed = time.perf_counter() - start
    result = {"prompt": args.prompt, "text": stream.text, "tokens": count, "tokens_per_s": count / max(elapsed, 1e-9)}
    if args.out:
        tokenizer.write_output(ids + drawn, args.out)
        result = {**{k: v for k, v in result.items() if k != "text"}, "out": args.out, "prompt_tokens": len(ids)}
        if args.plot:
            result["plot"] = plot_audio(args.out, args.plot, len(ids))
        if not args.json:
            say(f"wrote {args.out}: {len(ids)} prompt and {count} new tokens")
    if args.json:
        print(json.dumps({**result, **({"interrupted": True} if interrupted else {})}, sort_keys=True), flush=True)
    elif not args.out:  # the streamed text ends its line
        print(tail, end="" if (text + stream.text).endswith("\n") else "\n", flush=True)
    if interrupted:
        raise KeyboardInterrupt
    return {}  # the result is printed above, as it streamed
