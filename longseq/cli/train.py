"""``longseq train``: train a language model from a preset or a config file and overrides, with checkpoints and
exact resume.  Every run writes its resolved configuration to ``OUT/run.toml``; ``longseq train --config
OUT/run.toml`` runs it again."""

from __future__ import annotations

import argparse
import math
import os

from longseq.cli.common import common_flags, overrides, refuse_vocab_size, say, tokenizer_help
from longseq.config import PRESETS, ConfigError, RunConfig, apply_overrides, get_preset, load_run_config
from longseq.config.run import RECALL_TASKS, TaskConfig

DEFAULT_PRESET = "tiny-shakespeare"

EPILOG = f"""presets: {", ".join(PRESETS)} (TOML files of the package: longseq/config/presets)
--config FILE (.toml or .json, sections [model] [data] [train], the keys of --set) is laid over the preset the file
names (preset = "NAME"), else over --preset when given, else over the configs' defaults; --set goes on top of both.
override any field of the model, data or train config with --set key=value (dotted, e.g. model.dropout or
memory.mem_len, when a name is ambiguous); lists as comma lists or JSON, e.g. --set cutoffs=20000,40000,200000.
keys include: max_steps batch_size tgt_len mem_len n_layer d_model n_head d_head d_inner lr dropout
dropatt clamp_len same_length pre_lnorm norm ff bias final_norm cutoffs div_val untie_r warmup_steps schedule clip
grad_accum attention window dilation pos optimizer layer_lr_decay precision activation_checkpointing nan_patience
keep_last.
time budget: --set max_time_s=3600 stops at the first step boundary after an hour of training (whichever of
max_steps and max_time_s comes first), validates and saves; --resume --set max_time_s=7200 continues it (the
time counts across resumes).  progress: a bar on a terminal; elsewhere (a log, CI, nohup) a line every
progress_interval_s=30 seconds with step, loss, lr, tokens/s and the ETA.  samples while training:
--set sample_interval=500 sample_tokens=200 sample_prompt="ROMEO:" sample_temperature=0.8 (0: greedy).
data parallel: torchrun --nproc_per_node N -m longseq train ...
recall tasks (generated data, no corpus): --task passkey|mqar|copying|induction trains from the configs' defaults
(or --preset/--config) on sequences the task draws, e.g. longseq train --task passkey --set seq_len=256
tgt_len=64 mem_len=64 n_layer=2 max_steps=300 --out runs/passkey; task keys: seq_len segment_len min_distance
max_distance key_len alphabet n_pairs n_copy valid_size; longseq recall runs/passkey measures it by distance."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "train",
        help="train a model (default: tiny-shakespeare preset on the bundled corpus)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", help=f"named configuration (default: {DEFAULT_PRESET} without --config)")
    p.add_argument("--config", metavar="FILE", help="a run config file (.toml or .json), e.g. another run's run.toml")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE", help="override a config field")
    p.add_argument(
        "--data", help="corpus file or directory, or a directory from longseq data prepare (default: tiny-shakespeare)"
    )
    p.add_argument("--tokenizer", help=tokenizer_help())
    p.add_argument("--vocab-size", type=int, help="tokens of a BPE learnt from the training text (default 8192)")
    p.add_argument("--out", help="run directory (default: runs/PRESET or runs/CONFIG-NAME)")
    p.add_argument("--resume", action="store_true", help="continue exactly from OUT/last")
    p.add_argument("--overwrite", action="store_true", help="start over an existing run in OUT (its files are deleted)")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events (OUT/tensorboard)")
    p.add_argument("--task", choices=RECALL_TASKS, help="a recall task with generated data instead of a corpus")
    p.add_argument(
        "--teacher",
        metavar="CHECKPOINT",
        help="distil from this longseq checkpoint: the model trains on the KL to its softened top-k next-token "
        "distributions beside the next-token loss, with its tokenizer (task keys: temperature alpha top_k cache)",
    )
    return common_flags(p)


def run_name(args: argparse.Namespace) -> str:
    if args.task and not (args.preset or args.config):
        return args.task
    if args.preset or not args.config:
        return args.preset or DEFAULT_PRESET
    return os.path.splitext(os.path.basename(args.config))[0]


def base_config(args: argparse.Namespace) -> RunConfig:
    """The preset, or the config file laid over the preset it names, else over ``--preset``, else the defaults."""
    if args.task:  # generated data: the configs' defaults (or the preset, the file), with the task's section
        from longseq.config import DataConfig, ModelConfig, TrainConfig

        if args.data is not None or args.tokenizer is not None:
            raise ConfigError(f"--task {args.task} makes its own data (byte ids); --data and --tokenizer do not apply")
        base = RunConfig(ModelConfig(), DataConfig(tokenizer="byte"), TrainConfig())
        if args.preset or args.config:
            base = base_config(argparse.Namespace(**{**vars(args), "task": None}))
        return RunConfig(
            base.model, base.data.replace(path=None, tokenizer="byte"), base.train, TaskConfig(name=args.task)
        )
    if args.teacher:  # the preset, the file or the defaults, distilling from the teacher
        if args.task:
            raise ConfigError(f"--teacher distils a language model; --task {args.task} trains a recall task")
        base = base_config(argparse.Namespace(**{**vars(args), "teacher": None}))
        return RunConfig(base.model, base.data, base.train, TaskConfig(name="distill", teacher=args.teacher))
    if not args.config:
        return get_preset(args.preset or DEFAULT_PRESET)
    return load_run_config(args.config, base=get_preset(args.preset) if args.preset else None)


def preset_of(args: argparse.Namespace) -> RunConfig | None:
    """The preset the run starts from (``--preset``, the one a ``--config`` file names, or the default), whose
    settings are not the user's own; None for a config file over the configs' defaults."""
    from longseq.config.files import read_config_file

    if args.task and not (args.preset or args.config):
        return None
    if args.config:
        name = read_config_file(args.config).get("preset") or args.preset
        return get_preset(name) if isinstance(name, str) else None
    return get_preset(args.preset or DEFAULT_PRESET)


def data_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides of the command line, in order: what a prepared ``--data`` directory was made with (so that
    ``--data DIR`` alone matches it), then ``--set``, then the flags."""
    from longseq.data.prepared import data_settings

    extra = []
    if args.tokenizer is None:
        extra += [f"data.{key}={value}" for key, value in data_settings(args.data).items()]
    extra += overrides(args.set)
    if args.data is not None:
        extra.append(f"data.path={args.data}")
    if args.tokenizer is not None:
        extra.append(f"data.tokenizer={args.tokenizer}")
    if args.vocab_size is not None:
        extra.append(f"data.vocab_size={args.vocab_size}")
    if args.tensorboard:
        extra.append("train.logging.tensorboard=true")
    return extra


def run(args: argparse.Namespace) -> dict:
    from longseq.api import train
    from longseq.train.checkpoint import load_checkpoint_config
    from longseq.train.rundir import has_checkpoint

    out = args.out or os.path.join("runs", run_name(args))
    if args.resume and args.config:
        raise ConfigError(
            "--resume continues the run's own config (OUT/last); change settings with --set, not --config"
        )
    resuming = args.resume and has_checkpoint(out)  # else the trainer says why not (or starts a dead run afresh)
    base = load_checkpoint_config(os.path.join(out, "last")) if resuming else base_config(args)
    config = RunConfig(**apply_overrides(base.sections(), data_overrides(args)))
    refuse_vocab_size(args.vocab_size, config.data.tokenizer)
    result = train(
        config,
        out,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=not args.quiet,
        log=say,
        base=None if resuming else preset_of(args),
        file_config=base if args.config and not resuming else None,  # what the file set is said, not refused
    )
    import gc

    import torch.distributed as dist

    if dist.is_initialized():  # under torchrun: rank 0 reports
        rank = dist.get_rank()
        gc.collect()  # the trainer's DDP reducer and its pending work go before the process group does
        dist.barrier()  # no rank tears the group down while another still talks in it
        dist.destroy_process_group()
        if rank != 0:
            return {}
    summary = {
        "step": result.step,
        "train_loss": result.train_loss if math.isfinite(result.train_loss) else None,  # the log's, on a resume
        "loss": result.valid.get("loss"),  # None (JSON null, "n/a" in text) when this session ran no validation
        "ppl": result.valid.get("ppl"),
        "best_valid_loss": result.best_valid_loss,
        "tokens": result.tokens,
        "tokens_per_s": result.tokens_per_s,
        "elapsed_s": result.elapsed_s,
        "stopped_on_time": result.stopped_on_time,
        "checkpoint": os.path.join(out, "best"),
    }
    if "accuracy" in result.valid:  # a recall task
        summary["accuracy"], summary["chance"] = result.valid["accuracy"], result.valid["chance"]
    if "bpb" in result.valid:
        summary["bpb"] = result.valid["bpb"]
    if "bpc" in result.valid:
        summary["bpc"] = result.valid["bpc"]
        summary["unigram_bpc"] = result.unigram_bpc
        say(f"validation bpc {summary['bpc']:.3f} vs. unigram model {summary['unigram_bpc']:.3f}")
    return summary
