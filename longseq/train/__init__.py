"""Training: loop, optimizer and schedules, checkpoints."""

from longseq.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from longseq.train.loop import TrainingError, TrainResult, train
from longseq.train.optim import build_optimizer, learning_rate

__all__ = [
    "CheckpointError",
    "TrainResult",
    "TrainingError",
    "build_optimizer",
    "learning_rate",
    "load_checkpoint",
    "save_checkpoint",
    "train",
]
