"""What every command shares: the output conventions and the flags every command takes."""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from contextlib import contextmanager


def say(message: str) -> None:
    """A line for people, on stderr."""
    print(message, file=sys.stderr, flush=True)


@contextmanager
def warnings_said():
    """Within it, the library's warnings are said on stderr as ``warning: ...`` lines, when they happen (not in
    Python's ``file:line: UserWarning`` form)."""
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_, **__: say(f"warning: {message}")
        yield


def emit(result: dict, as_json: bool) -> None:
    """The command's result on stdout: one JSON object, or aligned ``key: value`` lines.  In JSON a number that is
    not finite (a training loss when no step ran) is ``null``: ``NaN`` is not JSON, and strict parsers (jq,
    JavaScript) refuse the whole line."""
    if as_json:
        print(json.dumps(_finite(result), sort_keys=True, allow_nan=False))
        return
    for key, value in result.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            print(f"{key:>16}:")  # a table of records (recall's cells): one line each, not one Python repr
            for item in value:
                print(" " * 18 + "  ".join(f"{k} {_shown(v)}" for k, v in item.items()))
            continue
        if isinstance(value, float):
            value = f"{value:.4f}" if math.isfinite(value) else str(value)
        elif value is None:
            value = "n/a"
        print(f"{key:>16}: {value}")


def _shown(value) -> str:
    """One value of a record in text output: floats to 4 places, nested records as JSON."""
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else str(value)
    if isinstance(value, (dict, list)):
        return json.dumps(_finite(value), sort_keys=True)
    return "n/a" if value is None else str(value)


def refuse_memory_settings(config, given: list[str]) -> None:
    """``given`` (``--mem-len``, ``--sinks`` as the user named them) refused by name where the model does not read
    them: :func:`~longseq.eval.evaluate.refuse_unread_settings` (an LSTM, or a stack of mixers whose recurrent state
    carries the whole past, as ``train`` refuses them)."""
    from longseq.eval.evaluate import refuse_unread_settings

    refuse_unread_settings(config, {flag.lstrip("-").replace("-", "_"): flag for flag in given})


def tokenizer_help() -> str:
    """What ``--tokenizer`` takes: the registry's kinds, or a tokenizer file."""
    from longseq.data.tokenizers import TOKENIZERS

    return f"{', '.join(TOKENIZERS)}, or the path of a tokenizer .json file"


def refuse_vocab_size(vocab_size: int | None, tokenizer: str) -> None:
    """``--vocab-size`` sizes a BPE learnt from the text; with any other tokenizer (which has its own vocabulary) it
    is an error, not ignored."""
    from longseq.config import ConfigError

    if vocab_size is not None and tokenizer != "bpe":
        raise ConfigError(f"--vocab-size sizes a BPE learnt from the text (--tokenizer bpe), not {tokenizer!r}")


def _finite(value):
    """``value`` with every NaN or infinite float, at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def common_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on the last line of stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def threads_flag(p: argparse.ArgumentParser) -> None:
    """``--threads N``: the CPU threads torch uses (a CPU shared with other work); :func:`set_threads` applies it."""
    p.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="CPU threads torch uses (torch.set_num_threads; default: its own)",
    )


def set_threads(args: argparse.Namespace) -> None:
    """``torch.set_num_threads(args.threads)`` when ``--threads`` was given, before any work."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def memory_lengths(text: str) -> list[int]:
    """An argparse type: comma-separated memory lengths >= 0, such as ``0,64,128``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,64,128, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected memory lengths >= 0 such as 0,64,128, got {text!r}")
    return values


def overrides(values: list[list[str]] | None) -> list[str]:
    """The ``--set`` groups as one list of ``key=value`` strings."""
    return [item for group in (values or []) for item in group]


def library_errors() -> tuple[type[BaseException], ...]:
    """The error types that carry a message for the user (printed without a traceback).  ``OSError`` names the file
    and the reason (read-only directory, a file where a directory is asked, disk full)."""
    from longseq.config import ConfigError
    from longseq.data.batching import BatchingError
    from longseq.data.corpus import CorpusError
    from longseq.data.tokenizers import TokenizerError
    from longseq.interop.transfo_xl import ConversionError
    from longseq.train.checkpoint import CheckpointError
    from longseq.train.trainer import TrainingError

    return (
        ConfigError,
        CorpusError,
        TokenizerError,
        CheckpointError,
        ConversionError,
        TrainingError,
        BatchingError,
        ValueError,
        OSError,
    )


def device_flag(p: argparse.ArgumentParser, default: str = "auto") -> None:
    p.add_argument(
        "--device", default=default, help="auto (CUDA when available), cpu or cuda[:N] (default: %(default)s)"
    )


def load_model(checkpoint: str, device: str = "auto"):
    """(path, model, tokenizer, run config) of ``checkpoint`` (a run directory means its best/, said on stderr)."""
    from longseq.runtime import set_matmul_precision
    from longseq.train.checkpoint import load_checkpoint, resolve_checkpoint
    from longseq.train.distributed import resolve_device

    path = resolve_checkpoint(checkpoint, say)
    device = resolve_device(device)
    set_matmul_precision(device, "high")  # TensorFloat-32 on a GPU, as in training
    model, tokenizer, run, _ = load_checkpoint(path, device=device)
    return path, model, tokenizer, run


def checkpoint_kind(run) -> str:
    """What a checkpoint of ``run`` is (a language model, fine-tuned for a task, trained on a recall task) and the
    command that reads it."""
    from longseq.tasks import TASKS

    return TASKS["lm" if run.task is None else run.task.name].checkpoint_kind()


def read_corpus(data: str | None, run, tokenizer, checkpoint: str):
    """The corpus to score: ``--data``, else the one the checkpoint was trained on (named in the error when it is
    not where the checkpoint says)."""
    from longseq.data.corpus import CorpusError, load_corpus

    path = data if data is not None else run.data.path
    try:
        return load_corpus(
            path,
            tokenizer.kind,
            tokenizer=tokenizer,
            lowercase=run.data.lowercase,
            text_column=run.data.text_column,
            clip_seconds=run.data.clip_seconds,
        )
    except CorpusError as exc:
        if data is None and path is not None:
            raise CorpusError(
                f"checkpoint {checkpoint} was trained on {path}, which cannot be read here ({exc}); "
                "pass --data PATH to give the corpus"
            ) from None
        if data is None:  # trained on a corpus given in memory (the Python API): the run names none
            raise CorpusError(
                f"checkpoint {checkpoint} names no corpus, so the bundled one was read, and {exc}; "
                "pass --data PATH to give the corpus it was trained on"
            ) from None
        raise
