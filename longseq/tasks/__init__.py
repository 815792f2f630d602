"""Tasks as plug-ins: language modeling and the fine-tuning tasks, each one file with a :class:`Task` subclass.
``TASKS`` is the registry: it maps the names ``TaskConfig.name`` may give to them."""

from longseq.config.base import check_choice
from longseq.config.run import RunConfig
from longseq.tasks.base import FinetuneOptions, StepContext, StepResult, Task
from longseq.tasks.classify import Classify
from longseq.tasks.lm import LanguageModeling
from longseq.tasks.mlm import MaskedLM
from longseq.tasks.span import Span

TASKS: dict[str, type[Task]] = {"lm": LanguageModeling, "classify": Classify, "span": Span, "mlm": MaskedLM}


def task_for(run: RunConfig, tokenizer=None, log=None, **kwargs) -> Task:
    """The task a run config names (language modeling when it names none)."""
    name = "lm" if run.task is None else run.task.name
    check_choice("task", name, tuple(TASKS))
    return TASKS[name](run, tokenizer, log, **kwargs)


__all__ = ["TASKS", "FinetuneOptions", "StepContext", "StepResult", "Task", "task_for"]
