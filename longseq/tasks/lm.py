"""Language modeling, the task of a plain ``longseq train`` run: ordered segments of parallel streams, the memory
carried from one optimizer step to the next, validation by one ordered pass with the memory."""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

from longseq.config.base import ConfigError
from longseq.config.checks import check_cutoffs, check_run
from longseq.config.run import RunConfig, TrainConfig
from longseq.data.batching import OrderedStream
from longseq.data.corpus import Corpus, load_data, unigram_bits_per_token
from longseq.data.sources import ids_sha256
from longseq.data.tokenizers import TokenizerError
from longseq.eval.evaluate import evaluate
from longseq.generation import generate
from longseq.model import Memory, build_model
from longseq.model.registry import check_lengths
from longseq.tasks.base import StepContext, StepResult, Task, check_reverse_complement


class LMBatches:
    """Each optimizer step reads ``window`` consecutive segments: 1, or ``mem_bptt`` (``mem_tokens_bptt``,
    ``state_bptt``) when the memory (memory tokens, recurrent layers' states) back-propagates through several."""

    def __init__(self, stream: OrderedStream, window: int) -> None:
        self.stream, self.window = stream, window

    def next(self) -> list:
        return [self.stream.next_segment() for _ in range(self.window)]

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)


class LanguageModeling(Task):
    """Next-token prediction on ``run.data``'s corpus (``corpus`` given: that one instead, e.g. in tests)."""

    name = "lm"
    writes_samples = True

    @classmethod
    def checkpoint_kind(cls) -> str:
        return "a language model: longseq eval scores it and longseq generate samples from it"

    def __init__(self, run: RunConfig, tokenizer=None, log=None, corpus: Corpus | None = None) -> None:
        super().__init__(run, tokenizer, log)
        self.corpus = corpus
        self.prompt: list[int] = []

    def prepare(self) -> RunConfig:
        d = self.run.data
        if d.path is not None:  # stored absolute, so the checkpoint finds its corpus from any directory
            d = d.replace(path=os.path.abspath(os.path.expanduser(d.path)))
        if self.corpus is None:  # a resumed run reads with the checkpoint's tokenizer (a BPE is not learnt again)
            self.corpus = load_data(d, tokenizer=self.tokenizer)
        self.tokenizer = self.corpus.tokenizer
        self.run = RunConfig(prepare_model_config(self.run, self.corpus), d, self.run.train, self.run.task)
        check_reverse_complement(self.run, self.tokenizer)
        if d.doc_reset and self.corpus.doc_ids is None:
            raise ConfigError(
                f"doc_reset=true needs a corpus of several documents (a directory of files); {self.corpus.source} is one"
            )
        self.log(
            f"data: {len(self.corpus.train):,} training tokens from {self.corpus.source}; "
            f"vocabulary {self.tokenizer.vocab_size:,}"
        )
        self._warn_about_validation(d)
        if self.run.train.sample.sample_interval:
            self.prompt = sample_prompt(self.tokenizer, self.run.train.sample.sample_prompt, self.corpus.valid)
        return self.run

    def _warn_about_validation(self, d) -> None:
        """Say when the validation split cannot measure what it should: the training tokens again (a layout whose
        valid file is its train file), or fewer tokens than one segment."""
        train, valid, source = self.corpus.train, self.corpus.valid, self.corpus.source
        if len(valid) == len(train) and np.array_equal(np.asarray(valid), np.asarray(train)):
            self.log(
                f"warning: the validation split of {source} holds the training split's tokens exactly: "
                "validation loss will measure memorisation, not generalisation"
            )
        if len(valid) <= d.eval_tgt_len:
            self.log(
                f"warning: the validation split of {source} has {len(valid)} tokens, not more than one segment "
                f"(eval_tgt_len={d.eval_tgt_len}): its loss is measured on {max(0, len(valid) - 1)} tokens"
            )

    def data_fingerprint(self) -> dict:
        """The sha256 of the training and validation token ids (:func:`~longseq.data.sources.ids_sha256`)."""
        vocab = self.tokenizer.vocab_size
        return {"train": ids_sha256(self.corpus.train, vocab), "valid": ids_sha256(self.corpus.valid, vocab)}

    @property
    def unit(self) -> str | None:
        return self.tokenizer.bits_metric

    def unigram_bpc(self) -> float | None:
        """Bits per character of a unigram model of the corpus, the baseline a char/byte model must beat."""
        if self.unit is None:
            return None
        return unigram_bits_per_token(self.corpus.train, self.corpus.valid, self.tokenizer.vocab_size)

    def build_model(self) -> nn.Module:
        return build_model(self.run.model)

    def _doc_ids(self, split: str):
        return self.corpus.doc_ids[split] if self.run.data.doc_reset else None

    def batches(self, world) -> LMBatches:
        d, t = self.run.data, self.run.train
        stream = OrderedStream(
            self.corpus.train,
            d.batch_size,
            d.tgt_len,
            varlen=d.varlen,
            seed=t.seed,
            doc_ids=self._doc_ids("train"),
            rows=world.rows(d.batch_size),
            complement=self.tokenizer.complement_ids() if d.rc_prob else None,
            rc_prob=d.rc_prob,
        )  # this rank's rows only
        return LMBatches(stream, self.window())

    def window(self) -> int:
        """The consecutive segments one step reads: those one gradient flows through."""
        return self.run.model.segments_per_step

    def train_step(self, ctx: StepContext, segments: list, memory: Memory | None) -> StepResult:
        """Each gradient-accumulation chunk of this rank's rows through every segment of the window, with one backward
        per chunk at the end of its window (through all its segments) and the chunk's memory carried along.  Only
        one chunk's graph is alive at a time, so ``grad_accum`` bounds the peak memory whatever the window."""
        accum, window = ctx.grad_accum, len(segments)
        recurrence = self.run.model.recurrence(
            mem_len=mem_len_at(ctx.step, self.run.train, self.run.model.memory.mem_len)
        )
        chunks_memory = memory.split(accum) if memory is not None else [None] * accum
        pieces = [row_chunks(segment, ctx.device, accum) for segment in segments]
        loss_sum = 0.0
        for c in range(accum):
            pending, carried = None, chunks_memory[c]
            for segment, chunks in zip(segments, pieces):
                if segment.new_epoch:
                    carried = None
                inp, lab, doc, first = chunks[c]
                layers = [] if self.wants_hidden else None  # the layers' outputs, the last the head's input
                extra = {} if layers is None else {"layer_outputs": layers}  # (the LSTM has no layers to list)
                with ctx.autocast():  # the model scores the labels itself unless the task scores its logits
                    labels = None if self.scores_logits else lab
                    out = ctx.net(inp, carried, labels, recurrence=recurrence, doc_ids=doc, **extra)
                total, loss = self.segment_loss(out, lab, first, layers)
                carried = out.mems
                pending = total if pending is None else pending + total
                loss_sum = loss_sum + loss.detach().float()  # on the device: the trainer reads it once
            ctx.backward(pending / (accum * window))
            chunks_memory[c] = carried.detach()  # the graph of this chunk's window ends here
        tokens = sum(seg.labels.numel() for seg in segments)
        return StepResult(loss_sum / (accum * window), Memory.join(chunks_memory), tokens)

    scores_logits = False  # True: the model returns its logits and segment_loss scores them (distillation)
    wants_hidden = False  # True: segment_loss reads the layers' outputs (distillation's hidden-state alignment)

    def segment_loss(self, out, labels, first, layers=None):
        """The loss to back-propagate for one chunk of one segment (with the auxiliary losses) and the next-token
        loss the log reports, from the model's output ``out``; ``first`` (R,): where the rows start in the split;
        ``layers``: the layers' outputs (``wants_hidden``), the last one the hidden states the head reads."""
        return (out.loss if out.aux_loss is None else out.loss + out.aux_loss), out.loss

    def validate(self, model: nn.Module, sharded: bool = False) -> dict:
        d, valid = self.run.data, self.corpus.valid
        return evaluate(
            model,
            valid,
            batch_size=min(d.eval_batch_size, max(1, len(valid) // 2)),
            tgt_len=d.eval_tgt_len,
            max_segments=self.run.train.eval_max_segments,
            bits_unit=self.unit,
            doc_ids=self._doc_ids("valid"),
            kv_memory=not sharded,  # the key/value cache projects W_R R outside the (sharded) layers
            tokenizer=self.tokenizer,
            progress=self.progress,
            progress_interval_s=self.run.train.logging.progress_interval_s,
        )

    def sample(self, model: nn.Module, step: int) -> tuple[str, str]:
        """``sample_tokens`` tokens after the prompt at ``sample_temperature``, from a generator seeded by the run's
        seed and ``step`` (the global RNG is not read); the header names the settings, the text is prompt and
        continuation decoded together."""
        s, d = self.run.train.sample, self.run.data
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(self.run.train.seed * 1_000_003 + step)
        tokens = generate(
            model,
            torch.as_tensor(self.prompt)[None],
            s.sample_tokens,
            temperature=s.sample_temperature,
            recurrence=self.run.model.recurrence(mem_len=self.run.model.memory.mem_len + d.tgt_len),
            segment_len=d.tgt_len,
            generator=generator,
        )
        how = "greedy" if s.sample_temperature == 0 else f"temperature {s.sample_temperature:g}"
        header = f"sample of {s.sample_tokens} tokens ({how}) after {self.tokenizer.decode(self.prompt)!r}:"
        return header, self.tokenizer.decode([*self.prompt, *tokens[0].tolist()])


def sample_prompt(tokenizer, prompt: str, valid) -> list[int]:
    """The ids training samples start from: ``prompt`` encoded (a word prompt not ending in a newline does not end
    its line), or the first 16 tokens of the validation split when it is empty."""
    if not prompt:
        return [int(i) for i in np.asarray(valid[: max(1, min(16, len(valid) - 1))])]
    try:
        ids = tokenizer.encode_prompt(prompt).tolist()
    except TokenizerError as exc:
        raise ConfigError(f"sample_prompt {prompt!r} cannot be read by the run's tokenizer: {exc}") from None
    if not ids:
        raise ConfigError(f"sample_prompt {prompt!r} encodes to no token; give at least one character or word")
    return ids


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch tensor made on the CPU, on ``device``: to a GPU through pinned memory without waiting (the copy
    overlaps the work already queued; the stream orders it before the kernels that read it)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def row_chunks(segment, device: torch.device, accum: int) -> list:
    """A segment's (inputs, labels, document ids, rows' first positions) cut into ``accum`` chunks of rows, on
    ``device`` (the positions stay on the host)."""
    inputs = to_device(segment.input_ids, device).chunk(accum, dim=0)  # the stream holds this rank's rows
    labels = to_device(segment.labels, device).chunk(accum, dim=0)
    docs = to_device(segment.doc_ids, device).chunk(accum, dim=0) if segment.doc_ids is not None else [None] * accum
    first = segment.first.chunk(accum, dim=0) if segment.first is not None else [None] * accum
    return list(zip(inputs, labels, docs, first))


def mem_len_at(step: int, train: TrainConfig, final: int) -> int:
    """The memory length the curriculum (``mem_len_start``, ``mem_len_warmup_steps`` or ``mem_len_warmup_frac``)
    allows at optimizer step ``step`` (0-based), growing linearly; ``final`` without a curriculum."""
    start, warmup = train.curriculum.mem_len_start, train.mem_len_ramp_steps
    if start < 0 or start >= final or step >= warmup:
        return final
    return start + (final - start) * step // warmup


def prepare_model_config(run: RunConfig, corpus: Corpus):
    """The model config with the vocabulary size of the tokenizer, checked with the rest of the run
    (:func:`~longseq.config.checks.check_run`: the cutoffs must fit the vocabulary; and what its choices need of the
    segments, :func:`~longseq.model.registry.check_lengths`)."""
    check_cutoffs(run.model.cutoffs, corpus.tokenizer.vocab_size, corpus.source)  # before the config refuses them
    model = run.model.replace(vocab_size=corpus.tokenizer.vocab_size)
    check_run(RunConfig(model, run.data, run.train, run.task), source=corpus.source)
    check_lengths(model, run.data)
    return model
