"""The training loop: ordered segments, carried memory, AdamW, periodic validation, exact resume.

The loop knows nothing of Transformer-XL beyond ``model(input_ids, mems, labels) -> (loss, mems)``.
Output directory::

    last/           full checkpoint (weights + optimizer + RNG + data position + memory)
    best/           weights of the best validation loss
    metrics.jsonl   one JSON object per logged step and per validation
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from longseq.config import ConfigError, RunConfig
from longseq.data.batching import OrderedStream
from longseq.data.corpus import Corpus, load_corpus, unigram_bits_per_token
from longseq.eval.evaluate import evaluate
from longseq.model import build_model
from longseq.model.memory import Memory
from longseq.train.checkpoint import TrainingState, load_training_state, load_weights, save_checkpoint
from longseq.train.distributed import (
    full_optimizer_state,
    full_state_dict,
    full_tensor,
    init_world,
    load_full_state_dict,
    shard_model,
    shard_optimizer_state,
)
from longseq.train.optim import build_optimizer, layer_of, learning_rate


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


def bits_unit(tokenizer_kind: str) -> str | None:
    return "bpc" if tokenizer_kind in ("byte", "char") else None


def _append_jsonl(path: str, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _device(name: str, world) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and world.size > 1:
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', world.rank))}"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but this machine has no GPU that torch can use")
    return torch.device(name)


def _tensorboard(out_dir: str):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("tensorboard=true needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter(os.path.join(out_dir, "tensorboard"))


def _flatten(record: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def layer_grad_norms(model) -> dict[str, float]:
    """L2 norm of the gradient of every depth (:func:`~longseq.train.optim.layer_of`): embedding, layer0, ..., top."""
    n_layer = getattr(model.config, "n_layer", 0)
    squares: dict[str, float] = {}
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        depth = layer_of(name, n_layer)
        key = "embedding" if depth == 0 else "top" if depth == n_layer + 1 else f"layer{depth - 1}"
        squares[key] = squares.get(key, 0.0) + float(full_tensor(param.grad.double().pow(2).sum()))
    return {key: value**0.5 for key, value in squares.items()}


def _truncate_log(path: str, step: int) -> float:
    """Drop log records written after the checkpoint we resume from, so the log matches the run; returns the
    training wall time (``elapsed_s``) logged by then, so the resumed run's clock continues from it."""
    if not os.path.exists(path):
        return 0.0
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill: the resumed run writes it again
                continue
    kept = [r for r in records if r.get("step", 0) <= step]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return max((r.get("elapsed_s", 0.0) for r in kept), default=0.0)


def prepare_model_config(run: RunConfig, corpus: Corpus) -> None:
    """Set the vocabulary size from the tokenizer and check that the cutoffs fit it."""
    vocab = corpus.tokenizer.vocab_size
    if run.model.cutoffs and run.model.cutoffs[-1] >= vocab:
        raise ConfigError(
            f"adaptive softmax cutoffs {run.model.cutoffs} do not fit the {vocab}-token vocabulary of {corpus.source}; "
            f"pass --set cutoffs=... with values below {vocab}, or cutoffs=[] for a plain softmax"
        )
    run.model = run.model.replace(vocab_size=vocab)
    m = run.model.memory
    rate = m.cmem_rate
    if (
        m.cmem_len
        and m.cmem_fn in ("conv", "linear")
        and (run.data.tgt_len % rate or m.mem_len % rate or run.data.varlen)
    ):
        raise ConfigError(
            f"cmem_fn={m.cmem_fn} compresses groups of exactly cmem_rate={rate} evicted states: tgt_len={run.data.tgt_len} "
            f"and mem_len={m.mem_len} must be multiples of it, and varlen must be off"
        )


def train(
    run: RunConfig,
    out_dir: str,
    *,
    resume: bool = False,
    corpus: Corpus | None = None,
    stop_after: int | None = None,
    progress: bool = True,
    log=None,
    after_backward=None,
) -> TrainResult:
    """Train ``run`` and write checkpoints and metrics under ``out_dir``.

    ``resume`` continues from ``out_dir/last`` exactly (same batches, dropout masks, memory and
    optimizer state).  ``stop_after`` ends the run early after that many optimizer steps
    (checkpointing first), which is how an interruption is simulated in tests.  ``after_backward(step, model)``
    is called after every backward pass, before the NaN guard looks at the gradients (fault injection in tests).
    """
    world = init_world()
    log = log if (log is not None and world.main) else (lambda message: None)
    os.makedirs(out_dir, exist_ok=True)
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    last_dir, best_dir = os.path.join(out_dir, "last"), os.path.join(out_dir, "best")
    state: TrainingState | None = None
    if resume:
        state = load_training_state(last_dir)

    torch.manual_seed(run.train.seed)
    if corpus is None:
        corpus = load_corpus(run.data.path, run.data.tokenizer, lowercase=run.data.lowercase)
    prepare_model_config(run, corpus)
    tc, dc = run.train, run.data
    if dc.batch_size % (tc.grad_accum * world.size):
        raise ConfigError(
            f"batch_size={dc.batch_size} must be divisible by grad_accum={tc.grad_accum} x {world.size} process(es)"
        )
    rows = world.rows(dc.batch_size)  # this rank's parallel streams

    device = _device(tc.device, world)
    sharded = tc.parallel == "fsdp" and world.size > 1
    if sharded and tc.precision == "fp16":
        raise ConfigError("precision=fp16 is not supported with parallel=fsdp yet; use precision=bf16")
    if sharded and run.model.cutoffs:
        raise ConfigError(
            "parallel=fsdp with the adaptive softmax (cutoffs) is not supported yet: a rank whose batch has no token "
            "of a tail cluster leaves that cluster without a gradient; use cutoffs=[] or parallel=ddp"
        )
    model = build_model(run.model).to(device)
    if hasattr(model, "transformer"):
        model.transformer.activation_checkpointing = tc.activation_checkpointing
    net = model
    if sharded:
        shard_model(model)  # in place: the parameters become this rank's shards (every rank built the same init)
    elif world.size > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)  # averages gradients across ranks; parameters start from rank 0's
    optimizer = build_optimizer(model, tc)
    scaler = torch.amp.GradScaler(device.type) if tc.precision == "fp16" else None  # dynamic loss scaling
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tc.precision)
    writer = _tensorboard(out_dir) if tc.tensorboard and world.main else None
    docs = corpus.doc_ids if dc.doc_reset else None
    if dc.doc_reset and docs is None:
        raise ConfigError(
            f"doc_reset=true needs a corpus of several documents (a directory of files); {corpus.source} is one"
        )
    train_docs = None if docs is None else docs["train"]
    stream = OrderedStream(corpus.train, dc.batch_size, dc.tgt_len, varlen=dc.varlen, seed=tc.seed, doc_ids=train_docs)
    unit = bits_unit(dc.tokenizer)
    unigram = unigram_bits_per_token(corpus.train, corpus.valid, corpus.tokenizer.vocab_size) if unit else None
    mems, step, best, tokens_seen, clock_offset, lr_scale = None, 0, None, 0, 0.0, 1.0

    def restore(state: TrainingState):
        if sharded:
            load_full_state_dict(model, load_file(os.path.join(last_dir, "model.safetensors")))
            optimizer.load_state_dict(shard_optimizer_state(optimizer, state.optimizer))
        else:
            load_weights(model, last_dir)
            optimizer.load_state_dict(state.optimizer)
        stream.load_state_dict(state.data_state)
        torch.set_rng_state(state.torch_rng)
        if scaler is not None and state.scaler:
            scaler.load_state_dict(state.scaler)
        mems = world.local_memory(state.mems)
        return mems, state.step, state.best_valid_loss, state.tokens_seen, state.lr_scale

    def write_metrics(record: dict) -> None:
        if world.main:
            _append_jsonl(metrics_path, record)
        if writer is not None:
            for key, value in _flatten(record).items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(key, value, record["step"])

    if state is not None:
        mems, step, best, tokens_seen, lr_scale = restore(state)
        clock_offset = _truncate_log(metrics_path, step) if world.main else 0.0
        log(f"resumed from {last_dir} at step {step}")
    elif os.path.exists(metrics_path) and world.main:
        os.remove(metrics_path)
    world.barrier()
    model.train()
    log(
        f"model: {model.num_parameters():,} parameters; data: {len(corpus.train):,} training tokens from {corpus.source}"
    )
    if run.model.memory.cmem_len:
        log(
            f"memory: effective temporal range (mem_len + cmem_rate * cmem_len) * n_layer = {run.model.effective_range}"
        )

    def checkpoint(directory: str, with_state: bool, metrics: dict | None = None) -> None:
        """Rank 0 writes; with the training state, or a sharded model, every rank takes part (the memory, the
        weights and the optimizer moments are gathered)."""
        nonlocal saved_at
        training = None
        weights = full_state_dict(model, keep=world.main) if sharded else None
        if with_state:
            saved_at = step
            full_mems = world.gather_memory(mems)
            training = TrainingState(
                step,
                stream.state_dict(),
                best,
                full_optimizer_state(optimizer, keep=world.main) if sharded else optimizer.state_dict(),
                torch.get_rng_state(),
                full_mems,
                tokens_seen,
                lr_scale,
                scaler.state_dict() if scaler is not None else None,
            )
        if not world.main:
            if with_state:
                world.barrier()
            return
        keep = None
        if with_state and tc.keep_last > 1 and os.path.isdir(directory):
            with open(os.path.join(directory, "trainer_state.json"), encoding="utf-8") as f:
                previous = json.load(f)["step"]
            keep = os.path.join(out_dir, "history", f"step-{previous:08d}")
            os.makedirs(os.path.dirname(keep), exist_ok=True)
        save_checkpoint(
            directory, model, run, corpus.tokenizer, training, metrics, keep_previous_as=keep, weights=weights
        )
        if keep is not None:
            history = sorted(os.listdir(os.path.dirname(keep)))
            for stale in history[: max(0, len(history) - (tc.keep_last - 1))]:
                shutil.rmtree(os.path.join(os.path.dirname(keep), stale), ignore_errors=True)
        if with_state:
            world.barrier()  # the others may read it next (NaN rollback)

    def validate() -> dict:
        return evaluate(
            model,
            corpus.valid,
            batch_size=min(dc.eval_batch_size, max(1, len(corpus.valid) // 2)),
            tgt_len=dc.eval_tgt_len,
            max_segments=tc.eval_max_segments,
            bits_unit=unit,
            doc_ids=None if docs is None else docs["valid"],
            kv_memory=not sharded,  # the key/value cache projects W_R R outside the (sharded) layers
        )

    losses: list[float] = []
    window = run.model.memory.mem_tokens_bptt if run.model.memory.mem_tokens else 1
    pending: list = [None] * tc.grad_accum
    valid: dict = {}
    end = tc.max_steps if stop_after is None else min(tc.max_steps, step + stop_after)
    in_step, snapshot, bad_steps, saved_at = False, None, 0, -1
    start_time, start_tokens = time.perf_counter(), tokens_seen
    bar = tqdm(
        total=tc.max_steps,
        initial=step,
        desc="train",
        unit="step",
        disable=not (progress and world.main) or None,
        dynamic_ncols=True,
    )
    try:
        while step < end:
            snapshot = (stream.state_dict(), torch.get_rng_state(), mems)  # the state of the last completed step
            in_step = True
            lr = learning_rate(step, tc) * lr_scale
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            # one optimizer step reads `window` consecutive segments: 1, or mem_tokens_bptt when memory
            # tokens back-propagate through several segments
            segments = [stream.next_segment() for _ in range(window)]
            optimizer.zero_grad(set_to_none=True)
            chunk_mems = mems.split(tc.grad_accum) if mems is not None else [None] * tc.grad_accum
            loss_sum = 0.0
            for j, segment in enumerate(segments):
                if segment.new_epoch:
                    chunk_mems = [None] * tc.grad_accum
                inputs = segment.input_ids[rows].to(device).chunk(tc.grad_accum, dim=0)
                labels = segment.labels[rows].to(device).chunk(tc.grad_accum, dim=0)
                doc_chunks = [None] * tc.grad_accum
                if segment.doc_ids is not None:
                    doc_chunks = segment.doc_ids[rows].to(device).chunk(tc.grad_accum, dim=0)
                for c, (inp, lab, doc) in enumerate(zip(inputs, labels, doc_chunks)):
                    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                        out = net(inp, chunk_mems[c], lab, doc_ids=doc)
                    total = out.loss if out.aux_loss is None else out.loss + out.aux_loss
                    pending[c] = total if pending[c] is None else pending[c] + total
                    loss_sum += out.loss.item()
                    chunk_mems[c] = out.mems
                    if j == window - 1:  # one backward per chunk, through all segments of the window
                        scaled = pending[c] / (tc.grad_accum * window)
                        (scaler.scale(scaled) if scaler is not None else scaled).backward()
                        pending[c] = None
            loss = world.mean(loss_sum / (tc.grad_accum * window))
            if after_backward is not None:
                after_backward(step + 1, model)
            if scaler is not None:
                scaler.unscale_(optimizer)
            if tc.grad_norm_interval and (step + 1) % tc.grad_norm_interval == 0:
                write_metrics({"step": step + 1, "grad_norms": layer_grad_norms(model)})
            grad_norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip or float("inf"))))
            if scaler is not None and math.isfinite(loss):
                grad_norm = 0.0  # an fp16 overflow is the loss scaler's to handle: it skips the step and rescales
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                bad_steps += 1
                what = f"loss {loss}, gradient norm {grad_norm}"
                if tc.nan_patience == 0:
                    raise TrainingError(
                        f"{what} at step {step + 1} (lr {lr:.3g}); lower lr or raise warmup_steps. "
                        f"The last good checkpoint is {last_dir}"
                    )
                optimizer.zero_grad(set_to_none=True)
                if scaler is not None:
                    scaler.update()  # closes this step's unscale_ (and backs the scale off if it saw an overflow)
                write_metrics({"step": step + 1, "skipped": what, "bad_steps": bad_steps})
                log(f"step {step + 1}: skipped ({what}); {bad_steps} bad step(s) in a row")
                in_step = False
                if bad_steps >= tc.nan_patience:
                    if not os.path.isdir(last_dir):
                        raise TrainingError(
                            f"{bad_steps} non-finite steps in a row at step {step + 1} and no checkpoint to roll back "
                            f"to yet; lower lr or raise warmup_steps"
                        )
                    mems, step, best, tokens_seen, lr_scale = restore(load_training_state(last_dir))
                    lr_scale *= tc.nan_lr_factor
                    bad_steps = 0
                    write_metrics({"step": step, "rollback": last_dir, "lr_scale": lr_scale})
                    log(
                        f"rolled back to {last_dir} (step {step}) after {tc.nan_patience} non-finite steps; "
                        f"learning rate scaled by {lr_scale:g}"
                    )
                continue  # the memory of the step before is kept
            bad_steps = 0
            mems = Memory.join(chunk_mems).detach()
            segment = segments[-1]
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            step += 1
            in_step = False
            tokens_seen += sum(seg.labels.numel() for seg in segments)
            losses.append(loss)
            elapsed = time.perf_counter() - start_time
            speed = (tokens_seen - start_tokens) / elapsed if elapsed > 0 else 0.0
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:,.0f}")
            if step % tc.log_interval == 0 or step == end:
                record = {"step": step, "loss": loss, "lr": lr, "tokens_per_s": speed}
                write_metrics({**record, "elapsed_s": clock_offset + elapsed})
            if step % tc.eval_interval == 0 or step == tc.max_steps:
                if world.main or sharded:  # under DDP the others go on to the checkpoint and wait there
                    valid = validate()  # a sharded model needs every rank (each gathers the weights in turn)
                    valid_record = {"step": step, **{f"valid_{k}": v for k, v in valid.items()}}
                    write_metrics({**valid_record, "elapsed_s": clock_offset + elapsed})
                    unit_text = f", {unit} {valid[unit]:.4f}" if unit else ""
                    log(f"step {step}: valid loss {valid['loss']:.4f}{unit_text}")
                    if sharded:  # every rank must take the same branch below: the best checkpoint is collective
                        valid["loss"] = world.mean(valid["loss"])
                    if best is None or valid["loss"] < best:
                        best = valid["loss"]
                        checkpoint(best_dir, with_state=False, metrics={"step": step, **valid})
                checkpoint(last_dir, with_state=True)
            elif tc.save_interval and step % tc.save_interval == 0:
                checkpoint(last_dir, with_state=True)
    except KeyboardInterrupt:
        bar.close()
        if in_step:  # interrupted inside a step: go back to where the last completed step left things
            stream.load_state_dict(snapshot[0])
            torch.set_rng_state(snapshot[1])
            mems = snapshot[2]
        log(f"interrupted at step {step}; saving {last_dir} so that --resume continues from here")
        checkpoint(last_dir, with_state=True)
        raise
    bar.close()
    if saved_at != step:
        checkpoint(last_dir, with_state=True)
    elapsed = time.perf_counter() - start_time
    return TrainResult(
        step=step,
        train_loss=losses[-1] if losses else float("nan"),
        valid=valid,
        best_valid_loss=best,
        tokens=tokens_seen,
        tokens_per_s=(tokens_seen - start_tokens) / elapsed if elapsed > 0 else 0.0,
        unigram_bpc=unigram,
        losses=losses,
    )
