"""Knowledge distillation: language modeling whose loss also pulls the student's next-token distribution towards a
teacher's (Hinton, Vinyals and Dean, 2015), any longseq model from any other of the same tokenizer::

    loss = (1 - alpha) * NLL(student) + alpha * T^2 * KL(teacher_T || student_T)

where ``_T`` is a distribution softened by the temperature T (the logits divided by it) and the T^2 keeps the
gradient's scale as T changes.  The KL is taken between the two distributions restricted to the teacher's ``top_k``
tokens at the position, each renormalised there (sparse distillation), the teacher's logits read from a cache of
the training split (:mod:`longseq.tasks.teacher`) by the position of each label; positions no teacher stream
predicted are left to the next-token loss.  Both are renormalised: with the student's whole distribution against
the teacher's renormalised top k, the KL's minimum puts all of the student's mass on those k tokens, which at a
high temperature hold little of the teacher's (1.9% for a word-level WikiText-2 teacher at T = 2, k = 8), and
a student equal to its teacher was pushed away from it; the tail's mass is left to the next-token loss.
The cache is made once, before the first step (in the run directory
unless ``task.cache`` names one), so a resumed run reads the same targets and resumes exactly, and several students
share one teacher pass.  With ``online`` the teacher runs beside the student instead, each segment read after the
``context`` tokens before it (no teacher memory carried, so a resumed run reads the same targets too), and
``hidden_weight`` aligns the two models' last hidden states (cosine distance; the same width).

The student is the run's model: its config, memory, batching and validation are language modeling's; validation
reports the student's own next-token loss, so runs with and without a teacher compare directly.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from fnmatch import fnmatch

import numpy as np
import torch
import torch.nn.functional as F

from longseq.config.base import ConfigError
from longseq.config.run import RunConfig
from longseq.config.task import DistillOptions
from longseq.data.sources import file_sha256, ids_sha256
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
    chosen = logits.float().gather(-1, top_ids.clamp(min=0))  # (B, T, k): the student on the same k tokens,
    student = F.log_softmax(chosen / temperature, dim=-1)  # renormalised there too (the teacher is a fixed point)
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # (B, T)
    kl = kl[known].mean() * temperature**2
    return (1 - alpha) * nll + alpha * kl, nll


def read_with_teacher(task: LanguageModeling, name: str) -> tuple[str, torch.nn.Module, RunConfig]:
    """Make ``task`` read its corpus with its teacher's tokenizer (refusing another one); the teacher's path, model
    and run config."""
    if task.teacher is None:
        raise ConfigError(f"a {name} run is given its teacher when it starts (longseq.api.train, longseq train)")
    path, teacher, teacher_tokenizer, teacher_run = task.teacher
    if task.tokenizer is not None and task.tokenizer.to_dict() != teacher_tokenizer.to_dict():
        raise ConfigError(f"the teacher {path} reads another tokenizer than this run's: {name} from its own")
    task.tokenizer = teacher_tokenizer  # the student reads the corpus with the teacher's tokenizer
    data = task.run.data.replace(tokenizer=os.path.join(os.path.abspath(path), "tokenizer.json"))
    task.run = RunConfig(task.run.model, data, task.run.train, task.run.task)
    return path, teacher, teacher_run


def same_teacher(path: str, recorded: str) -> str:
    """The sha256 of the teacher's weights at ``path``, refused when a run recorded another one."""
    sha = file_sha256(os.path.join(path, "model.safetensors"))
    if recorded and recorded != sha:
        raise ConfigError(
            f"the teacher {path} is not the one this run started from (its weights' sha256 differs): resume with "
            "the original teacher"
        )
    return sha


class Distillation(LanguageModeling):
    """Language modeling with a teacher (see the module docstring); options :class:`DistillOptions`."""

    name = "distill"
    Options = DistillOptions

    def __init__(self, run, tokenizer=None, log=None, corpus=None, teacher: Teacher | None = None,
                 init: Teacher | None = None) -> None:  # fmt: skip
        super().__init__(run, tokenizer, log, corpus)
        self.teacher, self.cache, self.init = teacher, None, init

    def prepare(self):
        o, path, teacher, teacher_run = self.options, *read_with_teacher(self, "distill")
        super().prepare()
        self._check(path, teacher_run)
        sha = same_teacher(path, o.teacher_sha256)
        init = o.init if self.init is None else os.path.abspath(self.init.path)  # resumed: as it was
        if o.online:
            self.context = teacher_run.model.memory.mem_len if o.context < 0 else o.context
            teacher.eval().requires_grad_(False)
            self.set_options(teacher=os.path.abspath(path), teacher_sha256=sha, init=init)
            return self.run
        cache = self._cache(teacher, teacher_run, sha)
        self.set_options(teacher=os.path.abspath(path), cache=cache, teacher_sha256=sha, init=init)
        return self.run

    def _check(self, path: str, teacher_run: RunConfig) -> None:
        """What a run cannot distil: hidden states of another width; strands the teacher did not read."""
        o, student, teacher = self.options, self.run.model, teacher_run.model
        if o.hidden_weight and student.d_model != teacher.d_model:
            raise ConfigError(
                f"task.hidden_weight aligns hidden states of the same width: the student's d_model is "
                f"{student.d_model}, the teacher's ({path}) {teacher.d_model}; set hidden_weight=0"
            )
        if self.run.data.rc_prob:
            raise ConfigError(
                f"data.rc_prob={self.run.data.rc_prob} reads rows as their other strand, which the teacher's "
                "distributions are not of: distil with rc_prob=0"
            )

    def _cache(self, teacher, teacher_run: RunConfig, sha: str) -> str:
        """The teacher cache's directory, made (or made again, where the run's own was made for another) when
        needed, and opened in :attr:`cache`."""
        o = self.options
        cache = os.path.abspath(o.cache or os.path.join(self.run_dir or ".", "teacher-cache"))
        ids_sha = ids_sha256(self.corpus.train, self.tokenizer.vocab_size)
        wanted = dict(teacher_sha256=sha, ids_sha256=ids_sha, tokens=len(self.corpus.train), top_k=o.top_k)
        if o.cache is None and os.path.exists(cache) and not fits(cache, **wanted):  # the run's own, made for another
            self.log(f"teacher: {cache} was made for another teacher, split or top_k; it is made again")
            shutil.rmtree(cache)
        if not os.path.exists(cache):
            self._write_cache(teacher, teacher_run, cache, sha, ids_sha)
        self.cache = TeacherCache(cache, **wanted)
        return cache

    def initialize(self, model) -> None:
        """A new run starts from ``task.init``'s weights: every tensor of the run's model, by name and shape (the
        model's other settings, dropout or the memory's length, may differ)."""
        if self.init is None:
            return
        mine, theirs = model.state_dict(), self.init.model.state_dict()
        differ = sorted(set(mine) ^ set(theirs)) + [n for n in mine if n in theirs and mine[n].shape != theirs[n].shape]
        if differ:
            raise ConfigError(
                f"task.init {self.init.path} holds another model than this run's (its tensors differ: "
                f"{', '.join(differ[:4])}): start from a checkpoint of the run's own architecture"
            )
        model.load_state_dict(theirs)

    def trainable(self, model):
        """The parameters ``task.train_only`` names (shell patterns of their names), or None: all of them."""
        patterns = self.options.train_only
        if not patterns:
            return None
        chosen = [p for name, p in model.named_parameters() if any(fnmatch(name, pattern) for pattern in patterns)]
        if not chosen:
            raise ConfigError(f"task.train_only={','.join(patterns)} names no parameter of the model")
        return chosen

    def _write_cache(self, teacher, teacher_run, cache: str, sha: str, ids_sha: str) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise ConfigError(
                f"no teacher cache at {cache}: one process writes it, so start the run once without torchrun until "
                "it has (or name a cache made so with task.cache, or set task.online=true)"
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

    scores_logits = True

    @property
    def wants_hidden(self) -> bool:
        return self.options.hidden_weight > 0

    def segment_loss(self, out, labels, first, layers=None):
        o, hidden = self.options, None
        if o.online:
            top_ids, top_logits, hidden = self._online(first, labels.size(1), labels.device)
        else:
            top_ids, top_logits = (t.to(labels.device) for t in self.cache.rows(first, labels.size(1)))
        total, nll = distillation_loss(out.logits, labels, top_ids, top_logits, o.temperature, o.alpha)
        if hidden is not None:
            total = total + o.hidden_weight * cosine_distance(layers[-1], hidden)
        return (total if out.aux_loss is None else total + out.aux_loss), nll

    @torch.no_grad()
    def _online(self, first: torch.Tensor, length: int, device) -> tuple:
        """The teacher's top-k ids and logits (R, length, k) and, when aligned, its last hidden states (R, length, E)
        for a segment whose rows start at ``first``, read after the ``context`` tokens before it (fewer at the very
        start of the split): a window of its own, no memory carried, so a resumed run reads the same targets."""
        teacher = self.teacher.model.to(device)
        context = min(self.context, int(first.min()))
        rows = [np.asarray(self.corpus.train[a - context : a + length]) for a in first.tolist()]
        inputs = torch.from_numpy(np.stack(rows).astype(np.int64)).to(device)
        layers = [] if self.wants_hidden else None
        out = teacher(inputs, layer_outputs=layers)
        logits = out.logits[:, context:].float()
        values, ids = logits.topk(min(self.options.top_k, logits.size(-1)), dim=-1)
        return ids, values, None if layers is None else layers[-1][:, context:]


def cosine_distance(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """1 - the cosine of the student's and the teacher's hidden states (B, T, E), averaged over the positions."""
    return (1 - F.cosine_similarity(student.float(), teacher.float(), dim=-1)).mean()
