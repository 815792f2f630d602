"""What a run trains for, and the options of each task: one config class per task, of which a run holds the one its
``name`` chooses (:class:`TaskConfig`, a tagged union).  Each task's class in :mod:`longseq.tasks` names its options
class (``Classify.Options`` is :class:`ClassifyOptions`); they live here, at the bottom of the house, because a
stored run loads without the tasks and the recall generators (:mod:`longseq.data.recall`) read their options.

An option the chosen task does not read has no field to be set in: ``TaskConfig(name="span", pooling="mean")``,
``--set pooling=mean`` on a span run and a ``[task]`` table that sets it are unknown-key errors naming the option
and the tasks that read it.  Runs stored by the one flat class that held every task's options load through
:func:`longseq.config.stored.stored_task`."""

from __future__ import annotations

from dataclasses import field
from typing import ClassVar

from longseq.config.base import Variants, check, check_finite, config

RECALL_TASKS = ("passkey", "mqar", "copying", "induction")  # generated tasks: no training file


@config
class TaskConfig(Variants):
    """What a run trains for: ``lm`` (language modeling on ``data``; no options of its own, the run's
    ``RunConfig.task`` is None or this), a fine-tuning task (``classify``, ``span``, ``mlm``) or a recall task
    (``passkey``, ``mqar``, ``copying``, ``induction``).  ``TaskConfig(name=..., **options)`` and
    ``TaskConfig.from_dict`` give the task's options class; reachable by ``--set`` and in a config file's ``[task]``
    table."""

    name: str = "lm"
    VARIANTS: ClassVar[dict[str, type]] = {}  # each task's options class, filled below (TASK_OPTIONS)
    sees_whole_document: ClassVar[bool] = False  # its model reads a whole document at once (pattern.lowrank serves it)
    is_language_model: ClassVar[bool] = False  # its checkpoints are language models (eval, generate, convert)

    @classmethod
    def elsewhere(cls, key: str, owners: list[str], tag: str) -> str:
        return f"--{key.replace('_', '-')} (task.{key}) is an option of the {', '.join(owners)} task, not of {tag}"


@config
class LMOptions(TaskConfig):
    """Language modeling has no task options: its sampling and memory curriculum are the training config's
    (``TrainConfig.sample``, ``TrainConfig.curriculum``)."""

    name: str = "lm"
    is_language_model: ClassVar[bool] = True


@config
class FinetuneOptions(TaskConfig):
    """What every fine-tuning task reads.  Each option's docstring is its ``longseq finetune`` flag's help
    (``--head-only``); ``written`` are the fields a run writes when it starts, which no one sets.

    ``lora_rank`` > 0 trains low-rank adapters (LoRA, Hu et al., 2021, through PEFT) on the modules whose names end
    in one of ``lora_targets`` instead of their weights; the rest stays frozen but the task's head.  Checkpoints
    hold the adapters beside the frozen weights; ``longseq convert`` merges them into the weights."""

    train: str = ""
    """training file: JSON lines (or a parquet/arrow table for classify and mlm)"""
    valid: str | None = None
    """validation file, in the same formats as the training file"""
    segment_len: int = 0
    """the length a document is read in (0: the checkpoint's tgt_len)"""
    base: str | None = None
    """the LM checkpoint it starts from"""
    head_only: bool = False
    """train the task head only"""
    group_by_length: bool = False
    """batches of documents of similar length (fewer filler segments per batch)"""
    sha256: dict = field(default_factory=dict)
    """the fingerprints of the files and of the base weights (a resume finds them at a new path by them)"""
    lora_rank: int = 0
    """train LoRA adapters of this rank instead of the weights (0: off; through PEFT)"""
    lora_alpha: float = 16.0
    """the adapters' scale is lora_alpha / lora_rank"""
    lora_dropout: float = 0.0
    """dropout on the adapters' input"""
    lora_targets: list[str] = field(default_factory=lambda: ["qkv_net", "o_net"])
    """the modules adapted, by the end of their names (attention's qkv_net and o_net; core_net.0 and core_net.3 are
    the feed-forward's)"""
    written: ClassVar[tuple[str, ...]] = ("sha256",)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_finite(self)
        check(bool(self.train), f"the {self.name} task needs its training file (--data FILE.jsonl)")
        check(self.segment_len >= 0, f"task.segment_len must be >= 0, got {self.segment_len}")
        if isinstance(self.lora_targets, str):
            self.lora_targets = [t.strip() for t in self.lora_targets.split(",") if t.strip()]
        check(self.lora_rank >= 0, f"task.lora_rank must be >= 0 (0: no adapters), got {self.lora_rank}")
        check(self.lora_alpha > 0, f"task.lora_alpha must be > 0, got {self.lora_alpha}")
        check(0.0 <= self.lora_dropout < 1.0, f"task.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        check(
            not self.lora_rank or bool(self.lora_targets),
            "task.lora_rank > 0 needs lora_targets: the names of the linear modules that get adapters",
        )
        check(
            not (self.lora_rank and self.head_only),
            "task.lora_rank and head_only both choose what trains: adapters, or the head alone; set one",
        )


@config
class ClmOptions(FinetuneOptions):
    """Language-model fine-tuning (:mod:`longseq.tasks.clm`): the checkpoint goes on predicting the next token, on
    the text ``train`` (a file or a directory, any format a corpus is read from; a single stream is cut 90/5/5 and
    its second part validates), or ``valid`` when given (a whole file).  The stream is read in segments of
    ``segment_len`` with the memory carried from one step to the next and back-propagated through ``mem_bptt``
    segments (the model's), as language-model training does.  Its checkpoints are language models: ``eval``,
    ``generate`` and ``convert`` read them."""

    name: str = "clm"
    is_language_model: ClassVar[bool] = True


@config
class ClassifyOptions(FinetuneOptions):
    """Long-document classification (:mod:`longseq.tasks.classify`)."""

    name: str = "classify"
    labels: list[str] = field(default_factory=list)
    """the label set: the training file's"""
    pooling: str = "document"
    """document: the mean of the whole document, every segment trains; last: the last position, mean: the mean of
    the final segment (with a stop-gradient memory, last and mean train only the final segment)"""
    lm_weight: float = 0.0
    """lambda of a joint next-token loss"""
    text_column: str = "text"
    """the name of the text field in the files"""
    label_column: str = "label"
    """the name of the label field in the files"""
    sees_whole_document: ClassVar[bool] = True
    written: ClassVar[tuple[str, ...]] = ("sha256", "labels")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.lm_weight >= 0, f"task.lm_weight must be >= 0, got {self.lm_weight}")


@config
class SpanOptions(FinetuneOptions):
    """Span extraction (:mod:`longseq.tasks.span`)."""

    name: str = "span"
    max_answer_len: int = 64
    """the longest answer in tokens"""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_answer_len >= 1, f"task.max_answer_len must be >= 1 token, got {self.max_answer_len}")


@config
class MaskedLMOptions(FinetuneOptions):
    """Masked language modeling (:mod:`longseq.tasks.mlm`).  Selective masking, as the Nucleotide Transformer and
    ESM choose what to mask: ``class_rates`` gives a token class of the tokenizer (its token type:
    ``nucleotide_cased``'s ``base``, ``soft_masked``, ``unknown_base``; ``protein``'s ``residue``, ``ambiguous``,
    ...) a rate of its own (0: never masked; a class not named: ``mask_rate``, but for ``mask`` and a FASTA record's
    ``separator``: 0), and ``span`` > 1 masks runs of that many tokens (about the same share of them)."""

    name: str = "mlm"
    mask_rate: float = 0.15
    """the fraction of tokens chosen for masking"""
    mask_token: str | None = None
    """the token standing for [MASK] (unset: <unk>, or byte 0)"""
    mask_id: int = -1
    """the id of mask_token"""
    text_column: str = "text"
    """the name of the text field in the files"""
    class_rates: list[str] = field(default_factory=list)
    """CLASS=RATE items: a masking rate per token class (--set class_rates=soft_masked=0.3,unknown_base=0)"""
    span: int = 1
    """mask runs of this many tokens"""
    sees_whole_document: ClassVar[bool] = True
    written: ClassVar[tuple[str, ...]] = ("sha256", "mask_id")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0.0 < self.mask_rate < 1.0, f"task.mask_rate must be in (0, 1), got {self.mask_rate}")
        self.rates()  # each item CLASS=RATE, RATE in [0, 1)
        check(self.span >= 1, f"task.span must be >= 1 token, got {self.span}")

    def rates(self) -> dict[str, float]:
        """``class_rates`` as a mapping: a token class -> its masking rate."""
        out = {}
        for item in self.class_rates:
            name, _, value = str(item).partition("=")
            try:
                rate = float(value)
            except ValueError:
                rate = -1.0
            check(
                bool(name.strip()) and 0.0 <= rate < 1.0,
                f"task.class_rates: {item!r} must be CLASS=RATE with RATE in [0, 1) (soft_masked=0.3)",
            )
            out[name.strip()] = rate
        return out


@config
class RecallOptions(TaskConfig):
    """The recall tasks (``passkey``, ``mqar``, ``copying``, ``induction``; :mod:`longseq.data.recall`) make their
    data: ``seq_len`` tokens a training sequence, read in segments of ``segment_len`` (0: ``tgt_len``) with the
    memory carried; ``min_distance``/``max_distance`` bound the passkey's distance (0: any that fits); ``key_len``
    digits a passkey; ``alphabet`` random tokens (filler, induction, copying); ``n_pairs`` key-value pairs (mqar);
    ``n_copy`` tokens to copy (copying); ``valid_size`` validation sequences."""

    name: str = "passkey"
    segment_len: int = 0
    seq_len: int = 256
    min_distance: int = 0
    max_distance: int = 0
    key_len: int = 3
    alphabet: int = 16
    n_pairs: int = 4
    n_copy: int = 16
    valid_size: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.segment_len >= 0, f"task.segment_len must be >= 0, got {self.segment_len}")
        for name in ("seq_len", "key_len", "n_pairs", "n_copy", "valid_size"):
            check(getattr(self, name) >= 1, f"task.{name} must be >= 1, got {getattr(self, name)}")
        check(2 <= self.alphabet <= 200, f"task.alphabet must be in [2, 200], got {self.alphabet}")
        check(
            self.name != "copying" or self.alphabet >= 3,
            f"task.alphabet must be >= 3 for copying (a noise token, a separator and a token to copy), got {self.alphabet}",
        )
        check(
            0 <= self.min_distance and (self.max_distance == 0 or self.min_distance <= self.max_distance),
            f"task.min_distance and max_distance must satisfy 0 <= min <= max (max 0: any), got "
            f"{self.min_distance}, {self.max_distance}",
        )


@config
class DistillOptions(TaskConfig):
    """Knowledge distillation (:mod:`longseq.tasks.distill`): a language model (the run's model, the student) learns
    from ``teacher`` (a longseq checkpoint of the same tokenizer) through the KL divergence of their next-token
    distributions softened by ``temperature`` (Hinton et al., 2015), weighed by ``alpha`` beside the next-token loss
    (``1 - alpha``).  The teacher's distributions (its ``top_k`` logits, renormalised) come from ``cache`` (a directory
    of them at every position of the training split, written at the start of the run, into the run directory unless
    ``cache`` names one), or with ``online`` from the teacher itself, reading each training segment after the
    ``context`` tokens before it (-1: its own ``mem_len``); ``hidden_weight`` > 0 (online, and a teacher of the
    student's width) adds that weight of the cosine distance between their last hidden states.  ``teacher_sha256``
    is the teacher's weights' fingerprint, written when the run starts.  ``init`` (a longseq
    checkpoint of the run's model config: a linearized student) gives a new run its starting weights, and
    ``train_only`` (shell patterns of parameter names, e.g. ``transformer.stack.layers.1.*``; empty: every parameter)
    the parameters that train."""

    name: str = "distill"
    is_language_model: ClassVar[bool] = True
    teacher: str = ""
    cache: str | None = None
    top_k: int = 16
    temperature: float = 2.0
    alpha: float = 0.5
    online: bool = False
    context: int = -1
    hidden_weight: float = 0.0
    teacher_sha256: str = ""
    init: str | None = None
    train_only: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_finite(self)
        check(bool(self.teacher), "the distill task needs its teacher: a longseq checkpoint (--teacher DIR)")
        check(self.top_k >= 1, f"task.top_k must be >= 1, got {self.top_k}")
        check(self.temperature > 0, f"task.temperature must be > 0, got {self.temperature}")
        check(0.0 <= self.alpha <= 1.0, f"task.alpha must be in [0, 1], got {self.alpha}")
        check(self.context >= -1, f"task.context must be >= 0 tokens (-1: the teacher's mem_len), got {self.context}")
        check(self.hidden_weight >= 0, f"task.hidden_weight must be >= 0, got {self.hidden_weight}")
        check(
            self.online or not self.hidden_weight,
            f"task.hidden_weight={self.hidden_weight} aligns the student's hidden states with the teacher's, which "
            "only a teacher run beside the student gives: set online=true",
        )
        check(
            not (self.online and self.cache),
            f"task.online=true reads the teacher as the student trains; cache={self.cache!r} names a cached pass: "
            "give one of them",
        )


@config
class TransferOptions(TaskConfig):
    """Attention transfer (:mod:`longseq.tasks.transfer`; LoLCATs' first stage of linearization): the run's model
    is ``teacher`` (a longseq checkpoint) with some attention layers replaced by mixers
    (:mod:`longseq.tasks.linearize`), and only those mixers train, each so that its layer gives the teacher layer's
    output on the teacher's own layer inputs (a mean squared error per layer).  A step reads ``step_segments`` consecutive
    segments from an empty memory, the teacher's and the student's memories carried within it;
    ``teacher_sha256`` is the teacher's weights' fingerprint, written when the run starts."""

    name: str = "transfer"
    is_language_model: ClassVar[bool] = True
    teacher: str = ""
    step_segments: int = 4
    teacher_sha256: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.teacher), "the transfer task needs its teacher: a longseq checkpoint (--teacher DIR)")
        check(self.step_segments >= 1, f"task.step_segments must be >= 1, got {self.step_segments}")


TASK_OPTIONS: dict[str, type[TaskConfig]] = {
    "lm": LMOptions,
    "classify": ClassifyOptions,
    "span": SpanOptions,
    "mlm": MaskedLMOptions,
    "clm": ClmOptions,
    "distill": DistillOptions,
    "transfer": TransferOptions,
    **dict.fromkeys(RECALL_TASKS, RecallOptions),
}
TaskConfig.VARIANTS.update(TASK_OPTIONS)
FINETUNE_TASKS = tuple(name for name, options in TASK_OPTIONS.items() if issubclass(options, FinetuneOptions))
