"""The checks that read more than one section of a run: the one place a run is checked as a whole, before it
builds anything (each section checks its own fields when it is made).  What a name the model chooses needs of the
run is its registry's to say (:func:`longseq.model.registry.check_lengths`, called beside :func:`check_run`)."""

from __future__ import annotations

from longseq.config.base import ConfigError, check
from longseq.config.model import FLOAT16_MAX, check_cap_fits
from longseq.config.run import RunConfig
from longseq.config.task import TASK_OPTIONS, TaskConfig


def check_run(run: RunConfig, world_size: int = 1, source: str | None = None) -> None:
    """Raise :class:`ConfigError` naming the settings that do not go together: the model against the data
    (``source`` names the corpus the vocabulary came from), the batch against gradient accumulation and the
    processes, and what sharded training (``parallel=fsdp`` with ``world_size`` > 1) supports."""
    m, d, t = run.model, run.data, run.train
    check_cutoffs(m.cutoffs, m.vocab_size, source)
    if t.runtime.precision == "fp16":  # attention scores are float16 under its autocast (the logits are upcast)
        check_cap_fits("attn_softcap with precision=fp16", m.attn_softcap, "float16", FLOAT16_MAX)
    if m.pattern.lowrank:
        check_lowrank_task_and_length(run)
    check(
        d.batch_size % (t.grad_accum * world_size) == 0,
        f"batch_size={d.batch_size} must be divisible by grad_accum={t.grad_accum} x {world_size} process(es)",
    )
    if t.runtime.parallel == "fsdp" and world_size > 1:
        check(
            t.runtime.precision != "fp16", "precision=fp16 is not supported with parallel=fsdp yet; use precision=bf16"
        )
        check(
            not t.sample.sample_interval,
            "sample_interval with parallel=fsdp is not supported: rank 0 alone cannot run a sharded model; set "
            "sample_interval=0 or use parallel=ddp",
        )
        check(
            not m.cutoffs,
            "parallel=fsdp with the adaptive softmax (cutoffs) is not supported yet: a rank whose batch has no token of a "
            "tail cluster leaves that cluster without a gradient; use cutoffs=[] or parallel=ddp",
        )
        check(
            m.arch != "lstm", "parallel=fsdp shards the decoder layers of a Transformer; use parallel=ddp for arch=lstm"
        )


def check_cutoffs(cutoffs: list[int], vocab_size: int, source: str | None = None) -> None:
    """The adaptive softmax's cutoffs must lie below the vocabulary size (0: not known yet); ``source`` names the
    corpus the vocabulary came from."""
    if cutoffs and vocab_size and cutoffs[-1] >= vocab_size:
        raise ConfigError(
            f"adaptive softmax cutoffs {cutoffs} do not fit the {vocab_size}-token vocabulary"
            f"{f' of {source}' if source else ''}; pass --set cutoffs=... with values below {vocab_size}, or "
            "cutoffs=[] for a plain softmax"
        )


def check_lowrank_task_and_length(run: RunConfig) -> None:
    """Linformer's projection (``pattern.lowrank``) serves the tasks that see a whole document (their options say:
    ``sees_whole_document``), over segments no longer than the columns of its matrices."""
    task = run.task if run.task is not None else TaskConfig()
    lowrank = f"pattern.lowrank={run.model.pattern.lowrank} (Linformer)"
    whole = [name for name, options in TASK_OPTIONS.items() if options.sees_whole_document]
    check(
        task.sees_whole_document,
        f"{lowrank} serves the tasks that read a whole document at once ({', '.join(whole)}), not {task.name}: "
        "every query of the projection sees every key, so it cannot predict the next token",
    )
    segment = task.segment_len or run.data.tgt_len
    check(
        segment <= run.model.pattern.lowrank_len,
        f"{lowrank} takes segments of up to pattern.lowrank_len={run.model.pattern.lowrank_len} positions; the run "
        f"reads segments of {segment} (task.segment_len, else data.tgt_len)",
    )
