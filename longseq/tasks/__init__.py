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


def stored_run(run: RunConfig) -> RunConfig:
    """``run`` as a checkpoint stored it: a task option the run did not record takes the value it had when the run
    was made (the task's ``stored_defaults``), not today's default, so an old checkpoint loads as it was trained."""
    if run.task is None:
        return run
    missing = {k: v for k, v in TASKS[run.task.name].stored_defaults.items() if k not in run.task.options}
    if not missing:
        return run
    return RunConfig(run.model, run.data, run.train, run.task.replace(options={**missing, **run.task.options}))


__all__ = ["TASKS", "FinetuneOptions", "StepContext", "StepResult", "Task", "stored_run", "task_for"]
