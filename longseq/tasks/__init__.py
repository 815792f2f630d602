"""Tasks as plug-ins: language modeling and the fine-tuning tasks, each one file with a :class:`Task` subclass.
``TASKS`` is the registry: it maps the names ``TaskConfig.name`` may give to them."""

from longseq.config.base import ConfigError, check_choice
from longseq.config.run import RECALL_TASKS, RunConfig, TaskConfig
from longseq.tasks.base import StepContext, StepResult, Task
from longseq.tasks.classify import Classify
from longseq.tasks.lm import LanguageModeling
from longseq.tasks.mlm import MaskedLM
from longseq.tasks.recall import Recall
from longseq.tasks.span import Span

TASKS: dict[str, type[Task]] = {"lm": LanguageModeling, "classify": Classify, "span": Span, "mlm": MaskedLM}
TASKS.update({name: type(f"Recall_{name}", (Recall,), {"name": name}) for name in RECALL_TASKS})  # generated data
FINETUNE_TASKS = tuple(name for name in TASKS if name != "lm" and name not in RECALL_TASKS)


def task_for(run: RunConfig, tokenizer=None, log=None, **kwargs) -> Task:
    """The task a run config names (language modeling when it names none)."""
    name = "lm" if run.task is None else run.task.name
    check_choice("task", name, tuple(TASKS))
    if run.task is not None:
        check_task_options(run.task)
    return TASKS[name](run, tokenizer, log, **kwargs)


def check_task_options(task: TaskConfig) -> None:
    """An option set for ``task`` (other than its default) that its task does not read is an error naming the task
    that reads it: ``pooling`` is an option of classify, not of span."""
    generated = task.name in RECALL_TASKS  # needs no training file
    defaults, reads = TaskConfig(name=task.name, train="" if generated else "x"), TASKS[task.name].reads
    for key, value in task.to_dict().items():
        if key != "name" and key not in reads and value != getattr(defaults, key):
            owners = [name for name, t in TASKS.items() if key in t.reads] or ["none"]
            raise ConfigError(
                f"--{key.replace('_', '-')} (task.{key}) is an option of the {', '.join(owners)} task, not of {task.name}"
            )


__all__ = ["FINETUNE_TASKS", "RECALL_TASKS", "TASKS", "StepContext", "StepResult", "Task", "task_for"]
