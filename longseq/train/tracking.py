"""Experiment trackers beside ``metrics.jsonl``: TensorBoard (``tensorboard=true``) and Weights & Biases
(``wandb=true``), each given every record's numbers, keyed as TensorBoard keys them (nested keys joined by ``/``),
at the record's step.

W&B runs under its own environment settings (``WANDB_MODE=offline`` writes nothing to the network; ``WANDB_API_KEY``,
``WANDB_ENTITY`` ...); its files go to ``OUT/wandb/``, the run's config is the run config, its name the run
directory's, and a resumed training run continues the same W&B run (its id is kept in ``OUT/wandb/longseq-run-id``).
Both are optional extras, imported only when asked for.
"""

from __future__ import annotations

import os
import secrets

from longseq.config import ConfigError
from longseq.config.base import leaves

WANDB_ID_FILE = "longseq-run-id"


def scalars(record: dict) -> dict[str, float]:
    """A metrics record's numbers (booleans, strings and the step left out), nested keys joined by ``/``."""
    return {
        key: value
        for key, value in leaves(record, sep="/").items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class TensorBoardTracker:
    def __init__(self, run_dir: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("tensorboard=true needs the tensorboard package: pip install tensorboard") from None
        self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: str, project: str, config: dict) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError('wandb=true needs the wandb package: pip install "longseq[wandb]"') from None
        directory = os.path.join(run_dir, "wandb")
        os.makedirs(directory, exist_ok=True)
        id_file = os.path.join(directory, WANDB_ID_FILE)
        if os.path.isfile(id_file):
            with open(id_file, encoding="utf-8") as f:
                run_id = f.read().strip()
        else:
            run_id = secrets.token_hex(4)  # eight lowercase hex digits, a valid W&B run id
            with open(id_file, "w", encoding="utf-8") as f:
                f.write(run_id + "\n")
        name = os.path.basename(os.path.abspath(run_dir))
        try:
            self.run = wandb.init(project=project, name=name, id=run_id, resume="allow", dir=run_dir, config=config)
        except wandb.errors.UsageError as exc:  # a setting W&B refuses (its environment variables too)
            raise ConfigError(f"W&B refused the run: {exc}") from None

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def open_trackers(run_dir: str, tensorboard: bool, wandb: bool, project: str, config: dict) -> list:
    """The trackers a run asked for (on the main rank only: the caller decides)."""
    trackers: list = []
    if tensorboard:
        trackers.append(TensorBoardTracker(run_dir))
    if wandb:
        trackers.append(WandbTracker(run_dir, project, config))
    return trackers
