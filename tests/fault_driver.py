"""Run a longseq command with signals delivered inside a chosen phase of a chosen step (a test harness).

    python tests/fault_driver.py PHASE STEP SIGNAL[,SIGNAL] -- train --out DIR ...

The hooks are set on the trainer once it is built, with PyTorch's own hook points and one wrapper:

* ``forward``: a forward pre-hook of the model, in training, on optimizer step STEP (1-based);
* ``backward``: a gradient hook of the first trainable parameter, on step STEP;
* ``optimizer``: inside ``optimizer.step()`` of step STEP: the first signal before the update (a step pre-hook),
  the second after it (a step post-hook), the case where a half-finished step would be saved;
* ``validation``: a forward pre-hook of the model in evaluation mode, in the validation after step STEP;
* ``save``: inside the first checkpoint write after step STEP (``_write_checkpoint_files``).

With two signals, both land in the phase (``optimizer``: one on each side of the update).  The process exits with
the command's exit code.
"""

from __future__ import annotations

import os
import signal
import sys

from longseq.cli import main
from longseq.train import checkpoint
from longseq.train.trainer import Trainer

PHASES = ("forward", "backward", "optimizer", "validation", "save")


def install(phase: str, step: int, signals: list[int]) -> None:
    pending = list(signals)

    def fire(how_many: int | None = None) -> None:
        for _ in range(len(pending) if how_many is None else min(how_many, len(pending))):
            os.kill(os.getpid(), pending.pop(0))

    original_build = Trainer.build

    def build(trainer: Trainer) -> None:
        original_build(trainer)
        training_step = lambda: trainer.step_count + 1 == step  # noqa: E731
        if phase in ("forward", "validation"):
            wanted = phase == "forward"

            def pre_hook(module, args):
                if module.training == wanted and (training_step() if wanted else trainer.step_count == step):
                    fire()

            trainer.model.register_forward_pre_hook(pre_hook)
        elif phase == "backward":
            first = next(p for p in trainer.model.parameters() if p.requires_grad)
            first.register_hook(lambda grad: (fire() if training_step() else None, grad)[1])
        elif phase == "optimizer":
            trainer.optimizer.register_step_pre_hook(lambda *a: fire(1) if training_step() else None)
            trainer.optimizer.register_step_post_hook(lambda *a: fire() if trainer.step_count + 1 == step else None)
        elif phase == "save":
            original_write = checkpoint._write_checkpoint_files

            def write(*args, **kwargs):
                if trainer.step_count >= step:
                    fire()
                return original_write(*args, **kwargs)

            checkpoint._write_checkpoint_files = write

    Trainer.build = build


if __name__ == "__main__":
    phase, step, names, separator, *argv = sys.argv[1:]
    assert phase in PHASES and separator == "--", sys.argv
    install(phase, int(step), [getattr(signal, name) for name in names.split(",")])
    sys.exit(main(argv))
