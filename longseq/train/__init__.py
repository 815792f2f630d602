"""Training: the one Trainer (every task), optimizers and schedules, checkpoints, distribution, signals.  The entry
points that give the Trainer a task, ``train`` and ``finetune``, are in :mod:`longseq.api`."""

from longseq.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from longseq.train.optim import build_optimizer, learning_rate
from longseq.train.signals import Interrupted
from longseq.train.trainer import Trainer, TrainingError, TrainResult

__all__ = [
    "CheckpointError",
    "Interrupted",
    "TrainResult",
    "Trainer",
    "TrainingError",
    "build_optimizer",
    "learning_rate",
    "load_checkpoint",
    "save_checkpoint",
]
