"""Checkpoints as data: a directory of JSON and safetensors files, written atomically, never pickled.

Layout of a checkpoint directory::

    config.json            {"format": ..., "run": RunConfig as JSON, "metrics": {...}}
    tokenizer.json         the tokenizer
    model.safetensors      weights (tied tensors stored once)
    trainer_state.json     step, data position, best validation loss, optimizer hyper-parameters (training only)
    trainer.safetensors    optimizer moments, RNG state and the recurrence memory (training only)
    manifest.json          size and sha256 of every file above, written last

The directory is first written under a temporary name beside the target, every file fsynced,
then renamed into place, so a crash never leaves a half-written checkpoint under the real name.
Loading checks the manifest, so a truncated or corrupted file is reported by name.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from longseq.config import ConfigError, RunConfig
from longseq.config.stored import FORMAT, Stored, needs_upgrade, upgrade
from longseq.data.sources import file_sha256
from longseq.data.tokenizers import Tokenizer, TokenizerError, load_tokenizer
from longseq.model import Memory, TransformerXLLM
from longseq.tasks import merge_adapters, task_for


class CheckpointError(RuntimeError):
    """A checkpoint directory that is missing, incomplete, corrupt or incompatible."""


@dataclass(kw_only=True)
class TrainingState:
    """What a training run needs beyond the weights to continue exactly."""

    step: int
    data_state: dict
    best_valid_loss: float | None
    optimizer: dict  # torch optimizer state_dict
    torch_rng: torch.Tensor
    memory: Memory | None  # the memory the task carries to the next step (language modeling), or None
    tokens_seen: int
    lr_scale: float = 1.0  # lowered by the NaN guard's rollbacks
    scaler: dict | None = None  # the fp16 loss scaler's state (scale, growth tracker)
    cuda_rng: list | None = None  # every CUDA device's RNG state, when CUDA is in use
    rank_rngs: list | None = None  # ranks 1 .. N-1 under torchrun: (CPU state, CUDA states or None) each

    def rng_of(self, rank: int) -> tuple[torch.Tensor, list | None] | None:
        """Rank ``rank``'s RNG states (CPU, CUDA), or None when the checkpoint has none for it (written by another
        number of processes, or before ranks saved their own)."""
        if rank == 0:
            return self.torch_rng, self.cuda_rng
        others = self.rank_rngs or []
        return others[rank - 1] if rank - 1 < len(others) else None

    pending_validation: bool = False  # a signal stopped this step's validation: the resumed run does it again
    data_sha256: dict | None = None  # the fingerprint of the training data (a resume on other data is refused)


def _write_json(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _optimizer_to_files(state: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    tensors, meta = {}, {}
    for index, slots in state["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                meta[f"{index}.{key}"] = value
    return {"param_groups": state["param_groups"], "scalars": meta}, tensors


def _optimizer_from_files(meta: dict, tensors: dict[str, torch.Tensor]) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for name, value in meta["scalars"].items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    directory: str,
    model: TransformerXLLM,
    run: RunConfig,
    tokenizer: Tokenizer,
    training: TrainingState | None = None,
    metrics: dict | None = None,
    keep_previous_as: str | None = None,
    weights: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write a checkpoint atomically to ``directory`` (replacing an existing one).

    The new checkpoint is written and fsynced under a temporary name, the old one is renamed aside and the
    new one renamed into place.  A process killed at any point leaves either the old or the new checkpoint
    (:func:`recover_checkpoint` puts an interrupted swap right).  ``keep_previous_as`` keeps the replaced
    checkpoint under that path instead of deleting it (checkpoint rotation).  ``weights`` (a full state dict,
    each tied parameter under one name) are written instead of ``model``'s own (a sharded model).  An ``OSError`` (disk full,
    permissions) or a safetensors write error becomes a :class:`CheckpointError` and leaves the previous checkpoint in place.
    """
    directory = os.path.abspath(directory)
    parent, name = os.path.split(directory)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"could not create the checkpoint directory {parent}: {exc}") from exc
    recover_checkpoint(directory)
    tmp = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
    old = os.path.join(parent, f".{name}.old-{os.getpid()}")
    try:
        os.makedirs(tmp)
        _write_checkpoint_files(tmp, model, run, tokenizer, training, metrics, weights)
        if os.path.exists(directory):
            os.replace(directory, old)
        os.replace(tmp, directory)
        _fsync(parent)
    except (OSError, SafetensorError) as exc:  # safetensors reports a failed write (disk full) as its own error
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(old) and not os.path.exists(directory):
            os.replace(old, directory)
        raise CheckpointError(
            f"could not write checkpoint {directory}: {exc}"
            + ("; the previous checkpoint is intact" if os.path.exists(directory) else "")
        ) from exc
    if keep_previous_as and os.path.exists(old):
        shutil.rmtree(keep_previous_as, ignore_errors=True)
        os.replace(old, keep_previous_as)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_parts(directory: str) -> list[str]:
    """What a :func:`save_checkpoint` of ``directory`` killed halfway leaves beside it (its ``.NAME.tmp-PID`` and
    ``.NAME.old-PID`` directories), newest first."""
    directory = os.path.abspath(directory)
    parent, name = os.path.split(directory)
    if not os.path.isdir(parent):
        return []
    return sorted(
        (os.path.join(parent, f) for f in os.listdir(parent) if f.startswith((f".{name}.tmp-", f".{name}.old-"))),
        key=os.path.getmtime,
        reverse=True,
    )


def recover_checkpoint(directory: str) -> None:
    """Repair what a kill during :func:`save_checkpoint` left behind and remove its leftovers.

    Killed between renaming the old checkpoint aside and renaming the new one into place, ``directory`` is
    missing: the complete new checkpoint (its manifest verifies) is moved in, else the old one.  Stale
    temporary directories of earlier processes are deleted."""
    directory = os.path.abspath(directory)
    leftovers = checkpoint_parts(directory)
    if not os.path.exists(directory):
        for candidate in leftovers:  # newest first: a complete new checkpoint beats the old one
            try:
                _verify(candidate)
            except CheckpointError:
                continue
            os.replace(candidate, directory)
            break
    for leftover in leftovers:
        if os.path.exists(leftover) and not leftover.endswith(f"-{os.getpid()}"):
            shutil.rmtree(leftover, ignore_errors=True)


def _write_checkpoint_files(tmp, model, run, tokenizer, training, metrics, weights=None) -> None:
    """Every file of a checkpoint, then the manifest, each fsynced."""
    _write_json(os.path.join(tmp, "config.json"), {"format": FORMAT, "run": run.to_dict(), "metrics": metrics or {}})
    _write_json(os.path.join(tmp, "tokenizer.json"), tokenizer.to_dict())
    if weights is None:
        save_model(model, os.path.join(tmp, "model.safetensors"), metadata={"format": FORMAT})
    else:
        save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": FORMAT})
    if training is not None:
        meta, tensors = _optimizer_to_files(training.optimizer)
        tensors["rng.torch"] = training.torch_rng
        for i, state in enumerate(training.cuda_rng or ()):
            tensors[f"rng.cuda.{i}"] = state
        for rank, (cpu, cuda) in enumerate(training.rank_rngs or (), 1):
            tensors[f"rng.rank{rank}.torch"] = cpu
            tensors.update({f"rng.rank{rank}.cuda.{i}": state for i, state in enumerate(cuda or ())})
        tensors.update(training.memory.to_tensors() if training.memory is not None else {})
        save_file(tensors, os.path.join(tmp, "trainer.safetensors"))
        _write_json(
            os.path.join(tmp, "trainer_state.json"),
            {
                "step": training.step,
                "data_state": training.data_state,
                "best_valid_loss": training.best_valid_loss,
                "optimizer": meta,
                "tokens_seen": training.tokens_seen,
                "lr_scale": training.lr_scale,
                "scaler": training.scaler,
                "pending_validation": training.pending_validation,
                "data_sha256": training.data_sha256,
            },
        )
    files = sorted(os.listdir(tmp))
    manifest = {
        f: {"size": os.path.getsize(os.path.join(tmp, f)), "sha256": file_sha256(os.path.join(tmp, f))} for f in files
    }
    _write_json(os.path.join(tmp, "manifest.json"), {"format": FORMAT, "files": manifest})
    for f in [*files, "manifest.json"]:
        _fsync(os.path.join(tmp, f))
    _fsync(tmp)


def weights_sha256(directory: str) -> str | None:
    """The sha256 of a checkpoint's weights as its manifest records them, unverified (None: no readable
    manifest): a fingerprint of the weights that costs no hashing."""
    try:
        with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
            return json.load(f)["files"]["model.safetensors"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


WEIGHT_FILES = ("config.json", "tokenizer.json", "model.safetensors")  # what every checkpoint holds
STATE_FILES = ("trainer_state.json", "trainer.safetensors")  # and what a resumable one holds beside them


def _verify(directory: str, needed: tuple[str, ...] = WEIGHT_FILES) -> dict:
    """The manifest's files, after checking that it lists every file in ``needed`` and that each listed file has
    its recorded size and sha256: a checkpoint error names the first file that does not."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    manifest_path = os.path.join(directory, "manifest.json")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not a complete longseq checkpoint (no manifest.json)") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path} is corrupt: {exc}") from None
    if not isinstance(files, dict):
        raise CheckpointError(f"{manifest_path} is corrupt: 'files' is not an object")
    _verify_listed(directory, files, needed)
    for name, entry in files.items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint {directory} is missing {name} (its manifest lists it)")
        if not isinstance(entry, dict) or not {"size", "sha256"} <= set(entry):
            raise CheckpointError(f"{manifest_path} is corrupt: the entry of {name} lacks its size or sha256")
        size = os.path.getsize(path)
        if size != entry["size"]:
            raise CheckpointError(
                f"checkpoint file {path} is truncated or altered: {size} bytes, expected {entry['size']}"
            )
        if file_sha256(path) != entry["sha256"]:
            raise CheckpointError(f"checkpoint file {path} is corrupt: its sha256 does not match the manifest")
    return files


def _read_config(directory: str) -> tuple[RunConfig, dict]:
    _verify(directory)
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        if not needs_upgrade(config.get("format")):
            return RunConfig.from_dict(config["run"]), config
        try:
            stored = upgrade(Stored(config["run"]), config.get("format"))
        except ConfigError:
            raise CheckpointError(
                f"{directory} has checkpoint format {config.get('format')!r}, expected {FORMAT!r}"
            ) from None
        return RunConfig.from_dict(stored.run), config
    except (json.JSONDecodeError, KeyError, AttributeError, ConfigError) as exc:
        raise CheckpointError(f"checkpoint {directory} has an invalid config.json: {exc}") from None


def resolve_checkpoint(path: str, log=None) -> str:
    """``path`` itself when it is a checkpoint; a run directory's ``best/`` (else its ``last/``), said on ``log``."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(os.path.join(path, "manifest.json")) or not os.path.isdir(path):
        return path
    for name in ("best", "last"):
        candidate = os.path.join(path, name)
        if os.path.isfile(os.path.join(candidate, "manifest.json")):
            if log is not None:
                log(f"{path} is a run directory: using its {name}/ checkpoint")
            return candidate
    raise CheckpointError(f"{path} is neither a checkpoint (no manifest.json) nor a run directory with best/ or last/")


def run_directory_checkpoint(directory: str) -> str:
    """``directory`` (made absolute) when it is a checkpoint, or not a run directory (its own error says what it
    lacks); a run directory's checkpoint (:func:`resolve_checkpoint`), said in a warning."""
    import warnings

    directory = os.path.abspath(os.path.expanduser(directory))
    is_run = any(os.path.isdir(os.path.join(directory, name)) for name in ("best", "last"))
    if os.path.isfile(os.path.join(directory, "manifest.json")) or not is_run:
        return directory
    return resolve_checkpoint(directory, lambda message: warnings.warn(message, stacklevel=4))


def load_checkpoint_config(directory: str) -> RunConfig:
    """The run config stored in a checkpoint, or in a run directory's (as :func:`load_checkpoint` chooses it); the
    manifest is checked first."""
    return _read_config(run_directory_checkpoint(directory))[0]


def load_checkpoint(
    directory: str, device: str | torch.device = "cpu"
) -> tuple[TransformerXLLM, Tokenizer, RunConfig, dict]:
    """Load a checkpoint's model (in eval mode), tokenizer, run config and stored metrics.  A fine-tuned
    checkpoint gives its task's model (``run.task`` names the task and its options, the label set among them), its
    LoRA adapters merged into the weights.
    ``directory`` is a checkpoint, or a run directory, whose checkpoint is chosen as every command's
    ``--checkpoint`` chooses it (:func:`resolve_checkpoint`: ``best/``, else ``last/``) and named in a warning."""
    directory = run_directory_checkpoint(directory)
    run, config = _read_config(directory)
    try:
        tokenizer = load_tokenizer(os.path.join(directory, "tokenizer.json"), vocab_size=run.model.vocab_size)
    except TokenizerError as exc:
        raise CheckpointError(f"checkpoint {directory} has an invalid tokenizer: {exc}") from None
    if tokenizer.vocab_size != run.model.vocab_size:
        raise CheckpointError(
            f"checkpoint {directory}: tokenizer.json has {tokenizer.vocab_size} tokens but the model "
            f"{run.model.vocab_size}; the two files do not belong together"
        )
    model = task_for(run, tokenizer).build_model()  # a language model, or a fine-tuned task's model
    rename = partial(_stored_weights, config) if needs_upgrade(config.get("format")) else None
    load_weights(model, directory, device, rename=rename)
    broken = [
        name
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point() and not tensor.isfinite().all()
    ]
    if broken:
        raise CheckpointError(
            f"checkpoint {directory} is broken: {len(broken)} weight tensor(s) hold NaN or Inf values "
            f"({', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''}); use an earlier checkpoint"
        )
    merge_adapters(model)  # LoRA fine-tuning's adapters folded into the weights: the plain model, for use
    model.to(device).eval()
    return model, tokenizer, run, config.get("metrics", {})


def load_weights(model: TransformerXLLM, directory: str, device: str | torch.device = "cpu", rename=None) -> None:
    """Load ``directory/model.safetensors`` into ``model``; every tensor must match by name and shape (a tied weight
    stored once).  ``rename`` maps the stored names to today's first (an older format:
    :mod:`longseq.config.stored`)."""
    path = os.path.join(directory, "model.safetensors")
    try:
        if rename is not None:
            tensors = rename(load_file(path, device=str(device)))
            missing, unexpected = model.load_state_dict(tensors, strict=False)
            shared = _shared_names(model)
            missing = [m for m in missing if m not in shared or not any(n in tensors for n in shared[m])]
        else:
            missing, unexpected = load_model(model, path, strict=False, device=str(device))
    except (SafetensorError, RuntimeError) as exc:
        raise CheckpointError(f"cannot load weights from {path}: {exc}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"weights in {path} do not match the config: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )


def _stored_weights(config: dict, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint of an older format (``config``, its config.json) under today's names."""
    return upgrade(Stored(config["run"], weights=tensors), config["format"]).weights


def _shared_names(model) -> dict[str, list[str]]:
    """For every parameter name, the other names of the same tensor (tied weights)."""
    by_id: dict[int, list[str]] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        by_id.setdefault(id(value), []).append(name)
    return {name: [n for n in names if n != name] for names in by_id.values() for name in names}


STATE_KEYS = ("step", "data_state", "best_valid_loss", "optimizer")  # what trainer_state.json must hold


def load_training_state(directory: str) -> TrainingState:
    """Load what :func:`save_checkpoint` stored for resuming (the manifest is checked first); a file or key that
    is not there is a :class:`CheckpointError` naming it."""
    directory = os.path.abspath(directory)
    recover_checkpoint(directory)
    files = _verify(directory)
    if "trainer_state.json" not in files:
        raise CheckpointError(f"{directory} holds weights only (no training state); it cannot be resumed")
    _verify_listed(directory, files, STATE_FILES)
    state_path = os.path.join(directory, "trainer_state.json")
    try:
        with open(state_path, encoding="utf-8") as f:
            meta = json.load(f)
        missing = [key for key in STATE_KEYS if key not in meta]
        tensors = load_file(os.path.join(directory, "trainer.safetensors"))
    except (json.JSONDecodeError, TypeError) as exc:
        raise CheckpointError(f"{state_path} is not valid JSON: {exc}") from None
    except SafetensorError as exc:
        raise CheckpointError(f"cannot read {directory}/trainer.safetensors: {exc}") from None
    if missing or "rng.torch" not in tensors:
        what = [f"key {k!r} of {state_path}" for k in missing] + (
            [] if "rng.torch" in tensors else [f"tensor 'rng.torch' of {directory}/trainer.safetensors"]
        )
        raise CheckpointError(f"checkpoint {directory} cannot be resumed: it lacks {', '.join(what)}")
    return TrainingState(
        step=meta["step"],
        data_state=meta["data_state"],
        best_valid_loss=meta["best_valid_loss"],
        optimizer=_optimizer_from_files(meta["optimizer"], tensors),
        torch_rng=tensors["rng.torch"],
        memory=Memory.from_tensors(_stored_memory(directory, tensors)),
        tokens_seen=meta.get("tokens_seen", 0),
        lr_scale=meta.get("lr_scale", 1.0),
        scaler=meta.get("scaler"),
        cuda_rng=_cuda_states(tensors, "rng.cuda."),
        rank_rngs=[
            (tensors[f"rng.rank{r}.torch"], _cuda_states(tensors, f"rng.rank{r}.cuda."))
            for r in range(1, 1 + sum(k.startswith("rng.rank") and k.endswith(".torch") for k in tensors))
        ]
        or None,
        pending_validation=bool(meta.get("pending_validation", False)),
        data_sha256=meta.get("data_sha256"),
    )


def _stored_memory(directory: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The training state's tensors of ``directory``, under today's names when its format is older."""
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if not needs_upgrade(config.get("format")):
        return tensors
    return upgrade(Stored(config["run"], training=tensors), config["format"]).training


def _cuda_states(tensors: dict, prefix: str) -> list | None:
    """The CUDA RNG states stored under ``prefix`` + device index, in device order (None: none stored)."""
    return [tensors[f"{prefix}{i}"] for i in range(sum(k.startswith(prefix) for k in tensors))] or None


def _verify_listed(directory: str, files: dict, needed: tuple[str, ...]) -> None:
    """``needed`` must be listed by the manifest (whose files :func:`_verify` has checked)."""
    unlisted = [name for name in needed if name not in files]
    if unlisted:
        raise CheckpointError(
            f"checkpoint {directory}: its manifest does not list {', '.join(unlisted)}, so it cannot be verified; "
            "the checkpoint is incomplete or altered"
        )
