"""The ``longseq`` model of the LM evaluation harness (lm-eval): a longseq checkpoint scored by any lm-eval task.

    python -m longseq.lm_eval --model longseq --model_args checkpoint=DIR[,tgt_len=128,mem_len=640] --tasks T ...

takes the flags of the ``lm_eval`` command (the harness finds models in the modules it has imported; the launcher
imports this one first).  From Python: ``lm_eval.simple_evaluate(model=LongseqLM("DIR"), tasks=[...])``.

How the requests are read:

* ``loglikelihood_rolling`` (perplexity tasks): the document, after the prefix token, in segments of ``tgt_len``
  tokens with the memory carried from segment to segment, every token scored once: exactly
  :func:`~longseq.eval.evaluate.scored_segments` (``longseq eval``'s pass) over that one document.  Documents are
  scored apart, each from an empty memory, as the harness asks.
* ``loglikelihood``: context and continuation read the same way; the continuation's tokens are scored with the
  model's softmax (and ``is_greedy`` says whether each is the argmax).
* ``generate_until``: the prompt read in segments, then one token at a time from a key/value memory
  (:func:`~longseq.generation.generate_stream`), greedy unless ``do_sample``, cut at the first ``until`` string.

The prefix token (the harness's BOS/EOS, the context of a document's first token and of an empty context) is the
newline: longseq's corpora join documents with one, so it is what the model saw before a document began.
"""

from __future__ import annotations

import lm_eval.models  # noqa: F401  (the harness's own models: registered before ours, so the registry is not empty)
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from longseq.data.tokenizers import prefix_id
from longseq.eval.evaluate import refuse_unread_settings, scored_segments, start_memory
from longseq.generation import check_sampling, generate_stream, windowed
from longseq.runtime import set_matmul_precision
from longseq.train.checkpoint import load_checkpoint, resolve_checkpoint
from longseq.train.distributed import resolve_device


def _model_arg(name: str, value, minimum: int) -> int | None:
    """The integer ``model_args`` ``name`` (None when not given), at least ``minimum``, or a ``ValueError`` naming
    it: ``tgt_len=-1`` scored every document at log-likelihood 0, ``tgt_len=0`` meant the default, ``abc`` named
    nothing."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"model_args {name}={value!r} must be an integer >= {minimum}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"model_args {name}={value!r} must be an integer >= {minimum}") from None
    if number < minimum:
        raise ValueError(f"model_args {name} must be >= {minimum}, got {number}")
    return number


def _flag(value) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


@register_model("longseq")
class LongseqLM(TemplateLM):
    """A longseq language-model checkpoint for the harness.

    ``--model_args``: ``checkpoint`` (a checkpoint directory, or a run directory: its ``best/``), ``device``
    (auto, cpu, cuda[:N]), ``tgt_len`` (segment length; default the checkpoint's ``eval_tgt_len``), ``mem_len``,
    ``clamp_len`` and ``same_length`` (default: the model's, as ``longseq eval --set``), ``max_gen_toks`` (default
    256).  ``batch_size`` from the harness is accepted and unused: every request is read alone.
    """

    def __init__(
        self,
        checkpoint: str,
        device: str = "auto",
        tgt_len=None,
        mem_len=None,
        clamp_len=None,
        same_length=None,
        max_gen_toks=256,
        batch_size=None,
        **unused,
    ) -> None:
        super().__init__()
        unused = {k: v for k, v in unused.items() if v is not None and k not in ("max_batch_size",)}
        if unused:
            raise ValueError(
                f"unknown model_args for longseq: {sorted(unused)}; known: checkpoint, device, tgt_len, mem_len, "
                "clamp_len, same_length, max_gen_toks"
            )
        settings = {"tgt_len": (tgt_len, 1), "mem_len": (mem_len, 0), "clamp_len": (clamp_len, -1)}
        settings = {name: _model_arg(name, value, least) for name, (value, least) in settings.items()}
        self.max_gen_toks = _model_arg("max_gen_toks", max_gen_toks, 1) or 256
        path = resolve_checkpoint(checkpoint)
        self._device = resolve_device(str(device))
        set_matmul_precision(self._device, "high")
        self.model, self.tokenizer, run, _ = load_checkpoint(path, device=self._device)
        if not run.is_language_model:
            raise ValueError(f"{path} is fine-tuned for {run.task.name}: the harness scores language models")
        self.checkpoint = path
        self.tgt_len = settings["tgt_len"] or run.data.eval_tgt_len
        given = {"mem_len": settings["mem_len"], "clamp_len": settings["clamp_len"], "same_length": same_length}
        refuse_unread_settings(self.model.config, {k: f"model_args {k}" for k, v in given.items() if v is not None})
        self.recurrence = self.model.config.recurrence(
            mem_len=settings["mem_len"], clamp_len=settings["clamp_len"], same_length=_flag(same_length)
        )
        self._prefix = prefix_id(self.tokenizer)

    # -- tokens ---------------------------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        if self._prefix is None:
            raise ValueError(
                f"the checkpoint's {self.tokenizer.kind} tokenizer cannot encode a newline as one token: a document "
                "(or an empty context) has no prefix token to be read after"
            )
        return self._prefix

    @property
    def tokenizer_name(self) -> str:
        return f"longseq-{self.tokenizer.kind}-{self.tokenizer.vocab_size}"

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        """The ids of ``string`` as written (``encode_prompt``: a word tokenizer's end of line only where the
        string has one), as the export's tokenizer gives them to the harness's ``hf`` model."""
        return [int(i) for i in self.tokenizer.encode_prompt(string)]

    def tok_decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    # -- scoring --------------------------------------------------------------------------------------------------
    def rolling_ids(self, string: str) -> list[int]:
        """The tokens a rolling log-likelihood reads: the prefix token, then the document's."""
        return [self.eot_token_id, *self.tok_encode(string)]

    def rolling_nll(self, ids: list[int]) -> float:
        """The summed NLL (nats) of ``ids[1:]``, each given everything before it: ``longseq eval``'s ordered pass
        (one stream, segments of ``tgt_len``, memory carried)."""
        if len(ids) < 2:
            return 0.0
        if windowed(self.model):
            raise ValueError("this checkpoint has absolute positions and no memory: score it with longseq eval")
        import numpy as np

        total = torch.zeros((), dtype=torch.float64)
        passes = scored_segments(
            self.model, np.asarray(ids, dtype=np.int64), batch_size=1, tgt_len=self.tgt_len, recurrence=self.recurrence
        )
        for _, nll in passes:
            total = total + nll.double().sum().cpu()
        return float(total)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for request in tqdm(requests, desc="longseq rolling", disable=disable_tqdm or None):
            (string,) = request.args
            result = -self.rolling_nll(self.rolling_ids(string))
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), result)
            out.append(result)
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        out = []
        for key, context, continuation in tqdm(requests, desc="longseq loglikelihood", disable=disable_tqdm or None):
            result = self.continuation_score(list(context), list(continuation))
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
            out.append(result)
        return out

    @torch.no_grad()
    def continuation_score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """(log-probability of ``continuation`` after ``context``, whether each of its tokens is the argmax), the
        whole read in segments of ``tgt_len`` with the memory carried; segments before the continuation are read
        by the backbone only."""
        if not continuation:
            return 0.0, True
        if windowed(self.model):
            raise ValueError("this checkpoint has absolute positions and no memory: score it with longseq eval")
        ids = torch.tensor(context + continuation, dtype=torch.long, device=self._device)
        inputs, targets, first = ids[:-1].unsqueeze(0), ids[1:], len(context) - 1  # first: a continuation target
        was_training, mems = self.model.training, start_memory(self.model)
        self.model.eval()
        logprob, greedy = torch.zeros((), dtype=torch.float64, device=self._device), True
        try:
            for start in range(0, inputs.size(1), self.tgt_len):
                segment = inputs[:, start : start + self.tgt_len]  # (1, T)
                if start + segment.size(1) <= first:
                    mems = self.model.read(segment, mems, recurrence=self.recurrence)
                    continue
                out = self.model(segment, mems, recurrence=self.recurrence)
                mems, skip = out.mems, max(first - start, 0)
                scores = out.logits[0, skip:].float().log_softmax(-1)  # (T', V)
                wanted = targets[start + skip : start + segment.size(1)]
                logprob = logprob + scores.gather(-1, wanted[:, None]).double().sum()
                greedy = greedy and bool((scores.argmax(-1) == wanted).all())
        finally:
            self.model.train(was_training)
        return float(logprob), greedy

    # -- generation -----------------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in tqdm(requests, desc="longseq generate", disable=disable_tqdm or None):
            context, gen_kwargs = request.args
            text = self.generate_text(context, dict(gen_kwargs or {}))
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out

    def generate_text(self, context: str, gen_kwargs: dict) -> str:
        """The continuation of ``context`` up to the first ``until`` string (not included) or ``max_gen_toks``."""
        until = gen_kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = _model_arg("max_gen_toks", gen_kwargs.pop("max_gen_toks", None), 1) or self.max_gen_toks
        sampling = _sampling(gen_kwargs)
        check_sampling(max_new, sampling["temperature"], sampling["top_k"], sampling["top_p"])
        prompt = self.tok_encode(context) or [self.eot_token_id]
        prompt_ids = torch.tensor([prompt], dtype=torch.long)
        made: list[int] = []
        stream = generate_stream(
            self.model, prompt_ids, max_new, segment_len=self.tgt_len, recurrence=self.recurrence, **sampling
        )
        try:
            for token in stream:
                made.append(int(token[0, 0]))
                text = self.tok_decode(made)
                cut = min((text.find(s) for s in until if s and s in text), default=-1)
                if cut >= 0:
                    return text[:cut]
        finally:
            stream.close()
        return self.tok_decode(made)


def _sampling(gen_kwargs: dict) -> dict:
    """``generate_stream``'s sampling arguments from the harness's ``gen_kwargs`` (greedy unless ``do_sample``);
    anything else is refused by name."""
    do_sample = _flag(gen_kwargs.pop("do_sample", False))
    temperature = float(gen_kwargs.pop("temperature", 1.0 if do_sample else 0.0))
    top_k, top_p = gen_kwargs.pop("top_k", None), gen_kwargs.pop("top_p", None)  # 0 is not "off" for top_p
    sampling = {
        "temperature": temperature if do_sample else 0.0,
        "top_k": 0 if top_k is None else int(top_k),
        "top_p": 1.0 if top_p is None else float(top_p),
    }
    if gen_kwargs:
        raise ValueError(f"unknown generation arguments for longseq: {sorted(gen_kwargs)}")
    return sampling


def main(argv: list[str] | None = None) -> None:
    """The ``lm_eval`` command with the ``longseq`` model registered, and longseq with transformers
    (``python -m longseq.lm_eval``)."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    register_transformers()
    cli_evaluate()


def register_transformers() -> bool:
    """Register longseq's classes with transformers, so that the harness's own ``hf`` model loads a longseq export
    (``--model hf --model_args pretrained=HF_DIR``); False where transformers 5 is not installed."""
    try:
        import longseq.integrations.transformers  # noqa: F401  (registers with AutoConfig, AutoModelForCausalLM)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
