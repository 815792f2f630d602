"""Knowledge distillation: language modeling whose loss also pulls the student's next-token distribution towards a
teacher's (Hinton, Vinyals and Dean, 2015), any longseq model from any other of the same tokenizer::

    loss = (1 - alpha) * NLL(student) + alpha * T^2 * KL(teacher_T || student_T)

where ``_T`` is a distribution softened by the temperature T (the logits divided by it) and the T^2 keeps the
gradient's scale as T changes.  The teacher's distribution is its ``top_k`` logits at the position, renormalised
(sparse distillation: the tail of a language model's distribution carries little of the KL), read from a cache of
the training split (:mod:`longseq.tasks.teacher`) by the position of each label; positions no teacher stream
predicted are left to the next-token loss.  The cache is made once, before the first step (in the run directory
unless ``task.cache`` names one), so a resumed run reads the same targets and resumes exactly, and several students
share one teacher pass.

The student is the run's model: its config, memory, batching and validation are language modeling's; validation
reports the student's own next-token loss, so runs with and without a teacher compare directly.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from longseq.config.base import ConfigError
from longseq.config.run import RunConfig
from longseq.config.task import DistillOptions
from longseq.data.sources import file_sha256, ids_sha256
from longseq.tasks.base import StepContext
from longseq.tasks.lm import LanguageModeling
from longseq.tasks.teacher import TeacherCache, TeacherCacheError, teacher_topk, write_teacher_cache


@dataclass(frozen=True)
class Teacher:
    """The teacher as :func:`longseq.train.checkpoint.load_checkpoint` read it: its checkpoint's directory, model,
    tokenizer and run config."""

    path: str
    model: torch.nn.Module
    tokenizer: object
    run: RunConfig

    def __iter__(self):
        return iter((self.path, self.model, self.tokenizer, self.run))


def fits(cache: str, **wanted) -> bool:
    """Whether the cache directory ``cache`` holds what ``wanted`` names (:class:`TeacherCache`'s checks)."""
    try:
        TeacherCache(cache, **wanted)
    except TeacherCacheError:
        return False
    return True


def distillation_loss(logits, labels, top_ids, top_logits, temperature: float, alpha: float):
    """(total, nll): the next-token NLL of ``logits`` (B, T, V) at ``labels`` (B, T; -100 ignored) and the
    temperature-softened KL from the teacher's top-k (``top_ids`` (B, T, k), -1 where it has none; ``top_logits``),
    mixed by ``alpha``, each a mean over the positions it covers."""
    log_probs = F.log_softmax(logits.float(), dim=-1)
    nll = F.nll_loss(log_probs.flatten(0, 1), labels.flatten(), ignore_index=-100)
    known = top_ids[..., 0] >= 0  # (B, T)
    if alpha == 0 or not bool(known.any()):
        return (1 - alpha) * nll, nll
    teacher = F.log_softmax(top_logits.float() / temperature, dim=-1)  # (B, T, k), renormalised over the top k
    student = F.log_softmax(logits.float() / temperature, dim=-1).gather(-1, top_ids.clamp(min=0))  # (B, T, k)
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # (B, T)
    kl = kl[known].mean() * temperature**2
    return (1 - alpha) * nll + alpha * kl, nll


class Distillation(LanguageModeling):
    """Language modeling with a teacher (see the module docstring); options :class:`DistillOptions`."""

    name = "distill"
    Options = DistillOptions

    def __init__(self, run, tokenizer=None, log=None, corpus=None, teacher: Teacher | None = None) -> None:
        super().__init__(run, tokenizer, log, corpus)
        self.teacher, self.cache = teacher, None

    def prepare(self):
        if self.teacher is None:
            raise ConfigError("a distill run is given its teacher when it starts (longseq.api.train, longseq train)")
        o, (path, teacher, teacher_tokenizer, teacher_run) = self.options, self.teacher
        if self.tokenizer is not None and self.tokenizer.to_dict() != teacher_tokenizer.to_dict():
            raise ConfigError(f"the teacher {path} reads another tokenizer than this run's: distill from its own")
        self.tokenizer = teacher_tokenizer  # the student reads the corpus with the teacher's tokenizer
        data = self.run.data.replace(tokenizer=os.path.join(os.path.abspath(path), "tokenizer.json"))
        self.run = RunConfig(self.run.model, data, self.run.train, self.run.task)
        super().prepare()
        sha = file_sha256(os.path.join(path, "model.safetensors"))
        if o.teacher_sha256 and o.teacher_sha256 != sha:
            raise ConfigError(
                f"the teacher {path} is not the one this run started from (its weights' sha256 differs): resume with "
                "the original teacher"
            )
        cache = o.cache or os.path.join(self.run_dir or ".", "teacher-cache")
        ids_sha = ids_sha256(self.corpus.train, self.tokenizer.vocab_size)
        wanted = dict(teacher_sha256=sha, ids_sha256=ids_sha, tokens=len(self.corpus.train), top_k=o.top_k)
        if o.cache is None and os.path.exists(cache) and not fits(cache, **wanted):  # the run's own, made for another
            self.log(f"teacher: {cache} was made for another teacher, split or top_k; it is made again")
            shutil.rmtree(cache)
        if not os.path.exists(cache):
            self._write_cache(teacher, teacher_run, cache, sha, ids_sha)
        self.cache = TeacherCache(cache, **wanted)
        self.set_options(teacher=os.path.abspath(path), cache=os.path.abspath(cache), teacher_sha256=sha)
        return self.run

    def _write_cache(self, teacher, teacher_run, cache: str, sha: str, ids_sha: str) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise ConfigError(
                f"no teacher cache at {cache}: make it before a distributed run (longseq distill-cache), so that one "
                "process writes it"
            )
        d = teacher_run.data
        self.log(f"teacher: its top {self.options.top_k} logits over {len(self.corpus.train):,} tokens into {cache}")
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        top_ids, top_logits = teacher_topk(
            teacher.to(device), self.corpus.train, self.options.top_k, d.eval_batch_size, d.eval_tgt_len, self.progress
        )
        write_teacher_cache(
            cache, top_ids, top_logits, teacher_sha256=sha, ids_sha256=ids_sha, batch_size=d.eval_batch_size,
            tgt_len=d.eval_tgt_len, mem_len=teacher_run.model.memory.mem_len,
        )  # fmt: skip

    def segment_loss(self, ctx: StepContext, inputs, labels, docs, first, memory, recurrence):
        with ctx.autocast():
            out = ctx.net(inputs, memory, recurrence=recurrence, doc_ids=docs)
        top_ids, top_logits = (t.to(ctx.device) for t in self.cache.rows(first, inputs.size(1)))
        o = self.options
        total, nll = distillation_loss(out.logits, labels, top_ids, top_logits, o.temperature, o.alpha)
        return (total if out.aux_loss is None else total + out.aux_loss), nll, out.mems
