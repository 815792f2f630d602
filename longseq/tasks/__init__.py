"""Tasks as plug-ins: language modeling, the fine-tuning tasks and the recall tasks, each one file with a
:class:`Task` subclass whose ``Options`` is its options class (:mod:`longseq.config.task`).  ``TASKS`` is the
registry: it maps the names ``TaskConfig.name`` may give to them.  ``merge_adapters`` folds a LoRA fine-tune's
adapters into the weights (what loading a checkpoint gives)."""

from longseq.config.base import check_choice
from longseq.config.run import RunConfig
from longseq.config.task import FINETUNE_TASKS, RECALL_TASKS
from longseq.tasks.adapters import merge_adapters
from longseq.tasks.base import StepContext, StepResult, Task
from longseq.tasks.classify import Classify
from longseq.tasks.clm import FinetuneLM
from longseq.tasks.distill import Distillation
from longseq.tasks.lm import LanguageModeling
from longseq.tasks.mlm import MaskedLM
from longseq.tasks.recall import Recall
from longseq.tasks.span import Span
from longseq.tasks.transfer import AttentionTransfer

TASKS: dict[str, type[Task]] = {
    "lm": LanguageModeling,
    "classify": Classify,
    "span": Span,
    "mlm": MaskedLM,
    "clm": FinetuneLM,
    "distill": Distillation,
    "transfer": AttentionTransfer,
}
TASKS.update({name: type(f"Recall_{name}", (Recall,), {"name": name}) for name in RECALL_TASKS})  # generated data


def task_for(run: RunConfig, tokenizer=None, log=None, **kwargs) -> Task:
    """The task a run config names (language modeling when it names none)."""
    name = "lm" if run.task is None else run.task.name
    check_choice("task", name, tuple(TASKS))
    return TASKS[name](run, tokenizer, log, **kwargs)


__all__ = ["FINETUNE_TASKS", "RECALL_TASKS", "TASKS", "StepContext", "StepResult", "Task", "merge_adapters", "task_for"]
