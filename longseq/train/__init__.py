"""Training: the one Trainer (every task), optimizers and schedules, checkpoints, distribution, signals."""

from longseq.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from longseq.train.optim import build_optimizer, learning_rate
from longseq.train.signals import Interrupted
from longseq.train.trainer import Trainer, TrainingError, TrainResult, train

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
    "train",
]
