"""The one trainer: build, restore, step, validate, save, for language modeling and every fine-tuning task.

The trainer knows nothing of Transformer-XL or of any task: a :class:`~longseq.tasks.base.Task` reads the data,
builds the model and computes each optimizer step's loss; the trainer owns everything around it, once:

* the run directory (never overwritten unasked, locked against a second trainer; :mod:`longseq.train.rundir`);
* atomic, verified checkpoints (``last/`` to resume, ``best/`` by validation loss), exact resume (weights,
  optimizer, every RNG, the data position and the carried memory), saved at validation, every
  ``save_interval`` steps, every ``save_every_s`` seconds, and on SIGINT, SIGTERM or SIGHUP
  (:mod:`longseq.train.signals`);
* the NaN guard (skip a non-finite step; roll back and lower the learning rate after ``nan_patience``);
* the schedule, gradient clipping, mixed precision (bf16, fp16 with loss scaling), activation checkpointing,
  DDP and FSDP under torchrun, ``metrics.jsonl`` and TensorBoard;
* where the run stops (``max_steps``, or the time budget ``max_time_s``, whichever comes first) and what a person
  watching it reads: the progress bar on a terminal, plain progress lines elsewhere (:mod:`longseq.progress`),
  samples every ``sample_interval`` steps (language modeling).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import time
from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from longseq.config import ConfigError, RunConfig
from longseq.config.checks import check_run
from longseq.config.files import write_run_config
from longseq.data.sources import CorpusChangedError
from longseq.data.tokenizers import load_tokenizer
from longseq.model.registry import check_lengths, model_spec
from longseq.model.spec import ModelSpec
from longseq.progress import TrainingProgress, duration
from longseq.runtime import set_matmul_precision
from longseq.tasks.base import StepContext, Task, set_trainable
from longseq.train.checkpoint import TrainingState, load_training_state, load_weights, save_checkpoint
from longseq.train.config_check import check_resumable, check_same_data
from longseq.train.distributed import (
    full_optimizer_state,
    full_state_dict,
    full_tensor,
    init_world,
    load_full_state_dict,
    resolve_device,
    shard_model,
    shard_optimizer_state,
)
from longseq.train.optim import build_optimizer, learning_rate
from longseq.train.rundir import RunDirectory
from longseq.train.signals import Interrupted, StopSignals
from longseq.train.tracking import open_trackers, scalars

SHOWN = ("loss", "bpc", "bpb", "accuracy", "exact_match", "f1", "ppl")  # the validation metrics the log names


class TrainingError(RuntimeError):
    """Training cannot go on (for example, the loss became NaN or infinite)."""


@dataclass
class TrainResult:
    step: int
    train_loss: float
    valid: dict
    best_valid_loss: float | None
    tokens: int
    tokens_per_s: float
    unigram_bpc: float | None
    losses: list[float]
    stopped_on_time: bool = False  # ended by max_time_s before max_steps
    elapsed_s: float = 0.0  # the run's training wall time, across resumes


def rng_states() -> tuple[torch.Tensor, list | None]:
    """The CPU RNG state and, when CUDA is in use, every device's."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def set_rng_states(cpu: torch.Tensor, cuda: list | None) -> None:
    torch.set_rng_state(cpu)
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


def layer_grad_norms(model, spec: ModelSpec) -> dict[str, float]:
    """L2 norm of the gradient of every depth (``spec.layer_depths``): embedding, layer0, ..., top."""
    n_layer, depths = model.config.n_layer, spec.layer_depths(model)
    squares: dict[str, float] = {}
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        depth = depths[name]
        key = "embedding" if depth == 0 else "top" if depth == n_layer + 1 else f"layer{depth - 1}"
        squares[key] = squares.get(key, 0.0) + float(full_tensor(param.grad.double().pow(2).sum()))
    return {key: value**0.5 for key, value in squares.items()}


class Trainer:
    """Trains ``task`` for ``run`` into ``out_dir``; :meth:`fit` runs the loop.

    ``resume`` continues from ``out_dir/last`` exactly; ``overwrite`` starts an existing run over.
    ``after_backward(step, model)`` is called after every backward pass, before the NaN guard looks at the
    gradients (fault injection in tests).  ``clock`` (seconds) measures the training time that ``max_time_s``,
    ``elapsed_s`` and the speed read; tests replace it with a clock of their own."""

    clock = staticmethod(time.perf_counter)

    def __init__(
        self,
        task: Task,
        run: RunConfig,
        out_dir: str,
        *,
        resume: bool = False,
        overwrite: bool = False,
        progress: bool = True,
        log=None,
        after_backward=None,
    ) -> None:
        self.world = init_world()
        self.log = log if (log is not None and self.world.main) else (lambda message: None)
        self.task, self.run, self.tc = task, run, run.train
        task.log = self.log  # rank 0 speaks for the run
        self.dir = RunDirectory(out_dir, resume=resume, overwrite=overwrite, main=self.world.main)
        self.resume, self.overwrite, self.progress = self.dir.resuming, overwrite, progress
        task.progress = progress and self.world.main  # a long validation says how far it is, as training does
        task.run_dir = self.dir.path
        self.after_backward = after_backward
        if self.dir.fresh_start:
            self.log(
                f"{self.dir.path} holds a run that stopped before its first checkpoint "
                f"({', '.join(self.dir.existing)}): nothing to resume, so it starts afresh"
            )
        self.step_count, self.best, self.tokens_seen, self.lr_scale = 0, None, 0, 1.0
        self.memory = None  # what the task carries from one step to the next (the LM's Memory), or None
        self.bad_steps, self.saved_at, self.clock_offset, self.last_save = 0, -1, 0.0, time.monotonic()
        self.losses: list[float] = []
        self.valid: dict = {}
        self.pending_validation = False  # a validation a signal stopped: the resumed run does it again
        self.updating = False  # inside the optimizer update: a KeyboardInterrupt here cannot go back a step
        self.data_sha256: dict | None = None
        self.trackers, self.start_time, self.start_tokens, self.last_lr = [], self.clock(), 0, 0.0
        self.validated_at, self.stopped_on_time = -1, False

    # --- build and restore ------------------------------------------------------------------------------------

    def build(self) -> None:
        tc, world = self.tc, self.world
        torch.manual_seed(tc.seed)
        if self.resume and self.task.tokenizer is None:  # read the data with the tokenizer the run was trained with
            self.task.tokenizer = load_tokenizer(os.path.join(self.dir.last, "tokenizer.json"))
        if tc.sample.sample_interval and not self.task.writes_samples:
            raise ConfigError(
                f"sample_interval={tc.sample.sample_interval}: samples are written by a language model; the "
                f"{self.task.name} task writes none (set sample_interval=0)"
            )
        self.run = self.task.prepare()
        check_run(self.run, world.size)
        check_lengths(self.run.model, self.run.data)
        self.checkpoint_state = load_training_state(self.dir.last) if self.resume else None
        self.data_sha256 = self.task.data_fingerprint()
        if self.resume:
            saved = check_resumable(self.dir.last, self.run, self.task.tokenizer)
            check_same_data(
                self.checkpoint_state.data_sha256,
                self.data_sha256,
                self.dir.last,
                self.run,
                self.log,
                saved_path=saved.data.path,
            )
        self.device = resolve_device(tc.runtime.device, world)
        set_matmul_precision(self.device, tc.runtime.matmul_precision)
        if world.size > 1 and self.device.type != world.device.type:
            raise ConfigError(
                f"device {self.device} under torchrun, but the process group exchanges {world.device.type} tensors "
                f"(NCCL with a GPU, gloo without): train on {world.device.type}"
            )
        self.sharded = tc.runtime.parallel == "fsdp" and world.size > 1
        self._build_model()
        if world.rank:  # every rank built the same initial model; from here each draws its own dropout masks
            torch.manual_seed(tc.seed + world.rank)
        self.optimizer = build_optimizer(self.model, tc)
        self.scaler = torch.amp.GradScaler(self.device.type) if tc.runtime.precision == "fp16" else None
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tc.runtime.precision)
        self.batches = self.task.batches(world)
        self.ctx = StepContext(
            self.net, self.device, world.rows(self.run.data.batch_size), tc.grad_accum, self.autocast_dtype, self.scaler
        )

    def _build_model(self) -> None:
        model = self.task.build_model().to(self.device)
        self.spec = model_spec(self.run.model.arch)  # what the trainer asks of the architecture
        self.spec.set_activation_checkpointing(model, self.tc.runtime.activation_checkpointing)
        if not self.resume:
            self.task.initialize(model)
        set_trainable(model, self.task.trainable(model))
        self.model = self.net = model
        if self.sharded:
            shard_model(model, self.spec)  # in place: every rank built the same init
        elif self.world.size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.net = DistributedDataParallel(model)  # averages gradients; parameters start from rank 0's
        if self.tc.runtime.compile != "none":  # the training step's model; validation and saving read self.model
            if self.run.task is not None:
                raise ConfigError(
                    f"compile={self.tc.runtime.compile} compiles a language model's training step; the "
                    f"{self.run.task.name} task reads documents in Python loops: set compile=none"
                )
            self.net = torch.compile(self.net, fullgraph=True, backend=self.tc.runtime.compile)

    def restore(self, state: TrainingState) -> None:
        """Everything :meth:`save` stored: weights, optimizer, data position, RNG, loss scale, memory."""
        if self.sharded:
            load_full_state_dict(self.model, load_file(os.path.join(self.dir.last, "model.safetensors")))
            self.optimizer.load_state_dict(shard_optimizer_state(self.optimizer, state.optimizer))
        else:
            load_weights(self.model, self.dir.last)
            self.optimizer.load_state_dict(state.optimizer)
        self.batches.load_state_dict(state.data_state)
        own = state.rng_of(self.world.rank)
        if own is None:  # saved by another number of processes: rank 0's stream (not exact), and said
            self.log(f"note: {self.dir.last} holds no RNG state of rank {self.world.rank}; it continues rank 0's")
            own = (state.torch_rng, state.cuda_rng)
        set_rng_states(*own)
        if self.scaler is not None and state.scaler:
            self.scaler.load_state_dict(state.scaler)
        local = self.world.local_memory(state.memory)
        self.memory = None if local is None else local.to(self.device)  # read on the CPU, used on the model's device
        self.step_count, self.best, self.tokens_seen = state.step, state.best_valid_loss, state.tokens_seen
        self.lr_scale, self.pending_validation = state.lr_scale, state.pending_validation
        self.saved_at = self.step_count  # the state restored is the one on disk: nothing new to save yet

    # --- one step ---------------------------------------------------------------------------------------------

    def step(self) -> bool:
        """One optimizer step; False when the NaN guard skipped it (the state of the step before is kept)."""
        tc = self.tc
        lr = learning_rate(self.step_count, tc) * self.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        batch = self.batches.next()
        self.optimizer.zero_grad(set_to_none=True)
        self.ctx.step = self.step_count
        result = self.task.train_step(self.ctx, batch, self.memory)
        if self.after_backward is not None:
            self.after_backward(self.step_count + 1, self.model)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if tc.logging.grad_norm_interval and (self.step_count + 1) % tc.logging.grad_norm_interval == 0:
            self.write_metrics({"step": self.step_count + 1, "grad_norms": layer_grad_norms(self.model, self.spec)})
        norm = full_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.optim.clip or float("inf")))
        loss, grad_norm = self.world.means(result.loss, norm)  # the step's one read from the device: both at once
        grad_norm = 0.0 if self.scaler is not None and math.isfinite(loss) else grad_norm  # fp16: the scaler's job
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self._bad_step(f"loss {loss}, gradient norm {grad_norm}", lr)
            return False
        self.updating = True  # from here the step is applied whole: weights, moments and bookkeeping
        self.bad_steps, self.memory = 0, result.memory
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.step_count += 1
        self.tokens_seen += result.tokens
        self.losses.append(loss)
        self.last_lr = lr
        self.updating = False
        return True

    def _bad_step(self, what: str, lr: float) -> None:
        """The NaN guard: skip the step; after ``nan_patience`` in a row, roll back to ``last/`` at a lower rate."""
        tc, step = self.tc, self.step_count + 1
        self.bad_steps += 1
        if tc.nan_patience == 0:
            raise TrainingError(
                f"{what} at step {step} (lr {lr:.3g}); lower lr or raise warmup_steps. "
                f"The last good checkpoint is {self.dir.last}"
            )
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.update()  # closes this step's unscale_ (and backs the scale off if it saw an overflow)
        self.write_metrics({"step": step, "skipped": what, "bad_steps": self.bad_steps})
        self.log(f"step {step}: skipped ({what}); {self.bad_steps} bad step(s) in a row")
        if self.bad_steps < tc.nan_patience:
            return
        if not os.path.isdir(self.dir.last):
            raise TrainingError(
                f"{self.bad_steps} non-finite steps in a row at step {step} and no checkpoint to roll back to yet; "
                f"lower lr or raise warmup_steps"
            )
        self.restore(load_training_state(self.dir.last))
        self.lr_scale *= tc.nan_lr_factor
        self.bad_steps = 0
        self.write_metrics({"step": self.step_count, "rollback": self.dir.last, "lr_scale": self.lr_scale})
        self.log(
            f"rolled back to {self.dir.last} (step {self.step_count}) after {tc.nan_patience} non-finite steps; "
            f"learning rate scaled by {self.lr_scale:g}"
        )

    # --- validate and save ------------------------------------------------------------------------------------

    def validate(self, stop: StopSignals) -> None:
        """Validation (aborted by a signal: then pending, done again by the resumed run), the best checkpoint,
        then ``last/``."""
        self.validated_at = self.step_count  # on every rank: a stop on time validates again only if this did not run
        # every rank validates (its own copy of the data): no rank waits in a collective while another one reads the
        # validation set, however long that takes, and every rank takes the same branches after it
        valid = stop.interruptible(self.task.validate, self.model, self.sharded)
        self.model.train()  # a validation stopped halfway may not have put the model back
        self.pending_validation = self.world.any(valid is None)
        if self.pending_validation:  # stopped by a signal (on some rank): the loop saves last/ and stops
            return
        self.valid = valid
        if valid:
            self.write_metrics(
                {"step": self.step_count, **{f"valid_{k}": v for k, v in valid.items()}, "elapsed_s": self.elapsed}
            )
            shown = {k: v for k, v in valid.items() if k in SHOWN}
            self.log(f"step {self.step_count}: " + ", ".join(f"valid {k} {v:.4f}" for k, v in shown.items()))
        loss = valid.get("loss")
        if loss is not None:  # the ranks' losses differ in the last bits at most: they agree on the mean
            loss = self.world.mean(loss)
        if loss is not None and (self.best is None or loss < self.best):
            self.best = loss
            self.save(self.dir.best, with_state=False, metrics={"step": self.step_count, **valid})
        self.save(self.dir.last, with_state=True)

    def save(self, directory: str, with_state: bool, metrics: dict | None = None) -> None:
        """Rank 0 writes; with the training state, or a sharded model, every rank takes part (the memory, the
        weights and the optimizer moments are gathered)."""
        world, training = self.world, None
        weights = full_state_dict(self.model, keep=world.main) if self.sharded else None
        if with_state:
            self.saved_at, self.last_save = self.step_count, time.monotonic()
            optimizer = full_optimizer_state(self.optimizer, keep=world.main) if self.sharded else None
            cpu, cuda = rng_states()
            others = world.gather_rngs(cpu, cuda)  # each rank resumes its own dropout stream
            training = TrainingState(
                step=self.step_count,
                data_state=self.batches.state_dict(),
                best_valid_loss=self.best,
                optimizer=optimizer or self.optimizer.state_dict(),
                torch_rng=cpu,
                memory=world.gather_memory(self.memory),
                tokens_seen=self.tokens_seen,
                lr_scale=self.lr_scale,
                scaler=self.scaler.state_dict() if self.scaler is not None else None,
                cuda_rng=cuda,
                rank_rngs=others or None,
                pending_validation=self.pending_validation,
                data_sha256=self.data_sha256,
            )
        if world.main:
            keep = self._history_slot(directory) if with_state else None
            save_checkpoint(
                directory,
                self.model,
                self.run,
                self.task.tokenizer,
                training,
                metrics,
                keep_previous_as=keep,
                weights=weights,
            )
            self._rotate(keep)
        if with_state:
            world.barrier()  # the others may read it next (NaN rollback)

    def _history_slot(self, directory: str) -> str | None:
        if self.tc.checkpoint.keep_last <= 1 or not os.path.isdir(directory):
            return None
        previous = load_training_state(directory).step
        os.makedirs(os.path.join(self.dir.path, "history"), exist_ok=True)
        return os.path.join(self.dir.path, "history", f"step-{previous:08d}")

    def _rotate(self, keep: str | None) -> None:
        if keep is None:
            return
        history = sorted(os.listdir(os.path.dirname(keep)))
        for stale in history[: max(0, len(history) - (self.tc.checkpoint.keep_last - 1))]:
            shutil.rmtree(os.path.join(os.path.dirname(keep), stale), ignore_errors=True)

    # --- the loop ---------------------------------------------------------------------------------------------

    def write_metrics(self, record: dict) -> None:
        if self.world.main:
            try:
                self.dir.append_metrics(record)
            except OSError as exc:  # a full disk: name the file, and what is safe
                kept = (
                    f"{self.dir.last} (step {self.saved_at}) is intact: free space and continue with --resume"
                    if self.saved_at >= 0
                    else "no checkpoint was saved yet"
                )
                raise TrainingError(f"could not append to {self.dir.metrics}: {exc.strerror or exc}; {kept}") from None
        if self.trackers:
            values = scalars(record)
            for tracker in self.trackers:
                tracker.log(values, record["step"])

    @property
    def elapsed(self) -> float:
        """The run's training wall time in seconds: this session's, plus the earlier sessions' (``clock_offset``)."""
        return self.clock_offset + self.clock() - self.start_time

    def _open(self) -> None:
        """Lock the directory, build everything (a failure removes a directory this run created), then restore."""
        self.dir.open()
        self.world.barrier()  # rank 0 holds the lock and has repaired a half-done save before anyone reads
        try:
            self.build()
            if self.overwrite and self.world.main:
                self.dir.clear()
            self.world.barrier()
            if (
                self.world.main
            ):  # run.toml, the resolved configuration: longseq train --config OUT/run.toml runs it again
                tracked = self.tc.logging
                self.trackers = open_trackers(
                    self.dir.path, tracked.tensorboard, tracked.wandb, tracked.wandb_project, self.run.to_dict()
                )
                write_run_config(self.run, os.path.join(self.dir.path, "run.toml"))
            if self.checkpoint_state is not None:
                self.restore(self.checkpoint_state)
                self.clock_offset = self.dir.truncate_metrics(self.step_count) if self.world.main else 0.0
                self.log(f"resumed from {self.dir.last} at step {self.step_count}")
                if self.pending_validation:
                    self.log(f"the validation of step {self.step_count} was interrupted: it runs again first")
                elif self.step_count >= self.tc.max_steps:
                    self.log(
                        f"the run is already at step {self.step_count} of max_steps {self.tc.max_steps}: nothing "
                        "to train (raise max_steps to continue it)"
                    )
                elif 0 < self.tc.max_time_s <= self.clock_offset:
                    self.log(
                        f"the run has already trained {duration(self.clock_offset)} of max_time_s "
                        f"{self.tc.max_time_s:g}: nothing to train (raise max_time_s to continue it)"
                    )
        except BaseException:
            self.dir.close(failed=True)
            raise

    def fit(self, stop_after: int | None = None) -> TrainResult:
        """Train to ``max_steps`` or the time budget ``max_time_s``, whichever comes first (or ``stop_after`` more
        steps, checkpointing first: a simulated interruption)."""
        self._open()
        try:
            with StopSignals() as stop:
                self._loop(stop, stop_after)
        finally:
            for tracker in self.trackers:
                tracker.close()
            self.dir.close(failed=self.saved_at < 0)
        return self._result()

    def _loop(self, stop: StopSignals, stop_after: int | None) -> None:
        tc = self.tc
        self.model.train()
        self.log(f"model: {sum(p.numel() for p in self.model.parameters()):,} parameters")
        if self.run.model.memory.cmem_len:
            self.log(
                f"memory: effective temporal range (mem_len + cmem_rate * cmem_len) * n_layer = "
                f"{self.run.model.effective_range}"
            )
        end = tc.max_steps if stop_after is None else min(tc.max_steps, self.step_count + stop_after)
        self.start_time, self.start_tokens = self.clock(), self.tokens_seen
        first_step = self.step_count
        if self.pending_validation:  # the resumed run validates the step whose validation a signal stopped
            self.validate(stop)
            self._stop_if_signalled(stop)
        progress = TrainingProgress(
            step=self.step_count,
            max_steps=tc.max_steps,
            max_time_s=tc.max_time_s,
            interval_s=tc.logging.progress_interval_s,
            enabled=self.progress and self.world.main,
            log=self.log,
            clock=self.clock,
        )
        with progress:
            while self.step_count < end:
                if self._out_of_time():
                    self._stop_on_time(stop, first_step)
                    break
                snapshot = (self.batches.state_dict(), rng_states(), self.memory)  # the last completed step's state
                try:
                    if not self.step():
                        continue
                except KeyboardInterrupt:  # raised by code, not a signal (signals only set stop.signum)
                    self._interrupted_inside_step(snapshot)
                    raise
                except CorpusChangedError as exc:  # read before the step changed anything
                    self._data_changed(exc, snapshot)
                speed = (self.tokens_seen - self.start_tokens) / max(self.clock() - self.start_time, 1e-9)
                progress.update(self.step_count, self.losses[-1], self.last_lr, speed, self.elapsed)
                try:
                    self._after_step(stop, end, speed)
                except CorpusChangedError as exc:  # in validation: the step is whole, its validation pending
                    self._data_changed(exc, None)
        if self.saved_at != self.step_count:
            self.save(self.dir.last, with_state=True)
        finished = self.step_count >= tc.max_steps or self.stopped_on_time
        if finished and not os.path.isdir(self.dir.best):  # nothing was validated
            self.save(self.dir.best, with_state=False, metrics={"step": self.step_count, "validated": False})

    def _out_of_time(self) -> bool:
        """Whether the time budget is spent (every rank agrees: rank 0 holds the earlier sessions' time)."""
        return self.tc.max_time_s > 0 and self.world.any(self.elapsed >= self.tc.max_time_s)

    def _stop_on_time(self, stop: StopSignals, first_step: int) -> None:
        """The budget is spent at this step boundary: say so and validate the step (unless it was validated); the
        loop then ends and saves ``last/``.  A resumed session that took no step leaves its checkpoint as it is
        (when its budget was spent before it started, ``_open`` said so)."""
        self.stopped_on_time = True
        if not (self.step_count == first_step and self.clock_offset >= self.tc.max_time_s):  # rank 0 decides the words
            self.log(
                f"stopped on time at step {self.step_count} of max_steps {self.tc.max_steps}: the run has "
                f"trained {duration(self.elapsed)}, max_time_s is {self.tc.max_time_s:g}; to continue it: "
                "--resume with a larger max_time_s"
            )
        if (self.step_count > first_step or not self.resume) and self.validated_at != self.step_count:  # every rank
            self.validate(stop)
        self._stop_if_signalled(stop)

    def _after_step(self, stop: StopSignals, end: int, speed: float) -> None:
        """Log, validate and save as the cadence asks; stop with a saved checkpoint when a signal came."""
        tc, saves, step = self.tc, self.tc.checkpoint, self.step_count
        if step % tc.logging.log_interval == 0 or step == end:
            self.write_metrics(
                {
                    "step": step,
                    "loss": self.losses[-1],
                    "lr": self.last_lr,
                    "tokens_per_s": speed,
                    "elapsed_s": self.elapsed,
                }
            )
        if tc.sample.sample_interval and step % tc.sample.sample_interval == 0 and self.world.main:
            self._sample()
        if step % tc.eval_interval == 0 or step == tc.max_steps:
            self.validate(stop)
        elif saves.save_interval and step % saves.save_interval == 0:
            self.save(self.dir.last, with_state=True)
        elif self.world.any(saves.save_every_s > 0 and time.monotonic() - self.last_save >= saves.save_every_s):
            self.save(self.dir.last, with_state=True)
        self._stop_if_signalled(stop)

    def _sample(self) -> None:
        """Rank 0 logs what the model writes now.  It cannot change the run: the task draws from a generator of its
        own, the global RNG states are put back all the same, and the model goes back to train mode."""
        cpu, cuda = rng_states()
        try:
            header, text = self.task.sample(self.model, self.step_count)
        finally:
            set_rng_states(cpu, cuda)
            self.model.train()
        self.log(f"step {self.step_count}: {header}\n{text}")

    def _stop_if_signalled(self, stop: StopSignals) -> None:
        """After a signal: ``last/`` holds this step (saved now unless it already does); raise :class:`Interrupted`."""
        if self.world.any(stop.signum is not None):
            if self.saved_at != self.step_count:
                self.save(self.dir.last, with_state=True)
            raise Interrupted(stop.signum or signal.SIGTERM, self.step_count, self.dir.last)

    def _interrupted_inside_step(self, snapshot) -> None:
        """A ``KeyboardInterrupt`` raised inside a step (by code: signals only set a flag).  Before the optimizer
        update nothing a checkpoint holds has changed but the data position, the RNG and the memory, which go back
        to the last completed step, and ``last/`` is saved there; inside the update the weights may be half
        changed, so nothing is saved and ``last/`` keeps the step it holds."""
        if self.updating:
            self.log(
                f"interrupted inside the optimizer update of step {self.step_count + 1}; {self.dir.last} "
                f"keeps step {self.saved_at}"
            )
            return
        self.batches.load_state_dict(snapshot[0])
        set_rng_states(*snapshot[1])
        self.memory = snapshot[2]
        self.log(f"interrupted at step {self.step_count}; saving {self.dir.last} for --resume")
        self.save(self.dir.last, with_state=True)

    def _data_changed(self, exc: CorpusChangedError, snapshot) -> None:
        """The corpus file changed under the run (:class:`~longseq.data.sources.SplitFile`): ``last/`` is saved at
        the last completed step (the data position, RNG and memory put back to it; with ``snapshot`` None the step
        is whole and its validation is done again on resume), then a :class:`TrainingError` says how to go on."""
        if snapshot is not None:
            self.batches.load_state_dict(snapshot[0])
            set_rng_states(*snapshot[1])
            self.memory = snapshot[2]
        else:
            self.pending_validation = True
        self.save(self.dir.last, with_state=True)
        raise TrainingError(
            f"{exc}. {self.dir.last} holds step {self.step_count}: once the corpus is as it was, continue with --resume"
        ) from None

    def _result(self) -> TrainResult:
        """What the run reports.  A session that trained no step (a resume of a finished run) reports the run's own
        last training loss, speed and validation as ``metrics.jsonl`` holds them, not an empty measurement."""
        elapsed = max(self.clock() - self.start_time, 1e-9)
        unigram = self.task.unigram_bpc()
        train_loss = self.losses[-1] if self.losses else float("nan")
        speed, valid = (self.tokens_seen - self.start_tokens) / elapsed, self.valid
        if not self.losses and self.world.main:
            logged, validated = self.dir.last_logged()
            train_loss, speed = logged.get("loss", train_loss), logged.get("tokens_per_s", speed)
            if not valid and validated.get("step") == self.step_count:
                valid = {k: v for k, v in validated.items() if k != "step"}
        return TrainResult(
            step=self.step_count,
            train_loss=train_loss,
            valid=valid,
            best_valid_loss=self.best,
            tokens=self.tokens_seen,
            tokens_per_s=speed,
            unigram_bpc=unigram,
            losses=self.losses,
            stopped_on_time=self.stopped_on_time,
            elapsed_s=self.elapsed,
        )
