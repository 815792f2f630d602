"""Hugging Face TransfoXL checkpoints: import into longseq and export back, without transformers.

An HF TransfoXL directory holds ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``.
``.bin`` files are read with ``torch.load(..., weights_only=True)`` only; the pickled tokenizer
vocabulary (``vocab.pkl``) is never opened.  Give the vocabulary as plain text instead, one token
per line in id order; see ``docs`` in the README for producing it from your own environment.

Tensor names (HF -> longseq; the backbone's layers and u, v sit in its layer stack, ``transformer.stack``):

    transformer.word_emb.*                      -> transformer.word_emb.* (same)
    transformer.r_{w,r}_bias (H, D)             -> transformer.stack.r_{w,r}_bias (H, D)          shared u, v
    transformer.layers.i.dec_attn.r_{w,r}_bias  -> transformer.stack.r_{w,r}_bias[i] (L, H, D)   untie_r
    transformer.layers.i.dec_attn.{qkv_net,o_net,layer_norm}.* -> transformer.stack.layers.i.dec_attn.(same)
    transformer.layers.i.dec_attn.r_net.*       -> transformer.stack.layers.i.dec_attn.rel.r_net.* (the encoding's)
    transformer.layers.i.pos_ff.CoreNet.{0,3}.* -> transformer.stack.layers.i.pos_ff.core_net.{0,3}.*
    transformer.layers.i.pos_ff.layer_norm.*    -> transformer.stack.layers.i.pos_ff.layer_norm.*
    crit.{cluster_weight,cluster_bias,out_layers.*,out_projs.*} -> same
    transformer.pos_emb.inv_freq                -> (computed, not stored)
"""

from __future__ import annotations

import json
import os
import re

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from longseq.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.data.tokenizers import EOS, UNK, ByteTokenizer, Tokenizer, WordTokenizer
from longseq.model import TransformerXLLM
from longseq.model.attention.patterns import layer_patterns
from longseq.outputs import EXPORTED_BY, check_output_directory, write_directory

EXPORT_METADATA = {"format": "pt", "exported_by": EXPORTED_BY}  # model.safetensors of a directory convert wrote


class ConversionError(ValueError):
    """An HF checkpoint that cannot be converted: not TransfoXL, unsupported settings, or shape mismatches."""


def _read_hf_config(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{directory} is not a Hugging Face checkpoint: it has no config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except json.JSONDecodeError as exc:
        raise ConversionError(f"{path} is not valid JSON: {exc}") from None
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if model_type != "transfo-xl" and not any("TransfoXL" in a for a in architectures):
        raise ConversionError(
            f"{directory} is not a TransfoXL checkpoint (model_type={model_type!r}, architectures={architectures})"
        )
    return config


def model_config_from_hf(hf: dict) -> ModelConfig:
    """Translate an HF ``TransfoXLConfig`` dict; unsupported settings are an error."""
    if hf.get("attn_type", 0) != 0:
        raise ConversionError(
            f"attn_type={hf['attn_type']} is not supported: only the relative attention of the paper (attn_type 0) is"
        )
    if hf.get("sample_softmax", -1) > 0:
        raise ConversionError(
            f"sample_softmax={hf['sample_softmax']} is not supported: only the full adaptive softmax is"
        )
    cutoffs = list(hf.get("cutoffs", [20000, 40000, 200000]))
    share = hf.get("proj_share_all_but_first", True)
    try:
        return ModelConfig(
            vocab_size=hf.get("vocab_size", 267735),
            n_layer=hf.get("n_layer", 18),
            d_model=hf.get("d_model", 1024),
            n_head=hf.get("n_head", 16),
            d_head=hf.get("d_head", 64),
            d_inner=hf.get("d_inner", 4096),
            dropout=hf.get("dropout", 0.1),
            dropatt=hf.get("dropatt", 0.0),
            mem_len=hf.get("mem_len", 1600),
            clamp_len=hf.get("clamp_len", 1000),
            same_length=hf.get("same_length", True),
            pre_lnorm=hf.get("pre_lnorm", False),
            cutoffs=cutoffs,
            div_val=hf.get("div_val", 4),
            d_embed=hf.get("d_embed", 1024),
            tie_weight=hf.get("tie_word_embeddings", True),
            tie_projs=[False] + [bool(share)] * len(cutoffs),
            untie_r=hf.get("untie_r", True),
            init_std=hf.get("init_std", 0.02),
            proj_init_std=hf.get("proj_init_std", 0.01),
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        )
    except ConfigError as exc:
        raise ConversionError(f"the HF config cannot be represented: {exc}") from None


def hf_config_from_model(config: ModelConfig) -> dict:
    """An HF ``TransfoXLConfig`` dict for a longseq model config."""
    ties = config.proj_ties
    p, pos = config.pattern, config.positions.pos
    full = all(pattern.is_full for pattern in layer_patterns(config))
    if not full or p.bidirectional or pos != "sinusoidal" or config.memory.compacted:
        raise ConversionError(
            f"HF TransfoXL has causal full attention with sinusoidal positions and a plain memory only; this model "
            f"has attention={p.attention}, bidirectional={p.bidirectional}, pos={pos}, memory={config.memory}"
        )
    if config.arch != "transformer" or set(config.layer_mixers) != {"attention"} or config.hourglass.shorten_layers:
        raise ConversionError(
            f"HF TransfoXL is a stack of attention layers at one resolution; this model has arch={config.arch}, "
            f"mixer={config.mixer}, shorten_layers={config.hourglass.shorten_layers}"
        )
    paper_block = dict(
        norm="layernorm",
        ff="relu",
        bias=True,
        final_norm=False,
        attn_softcap=0.0,
        logit_softcap=0.0,
        qk_norm=False,
        qkv_bias=False,
        attn_out_bias=False,
        head_bias=True,
        embed_scale=True,
    )
    other = {k: getattr(config, k) for k, v in paper_block.items() if getattr(config, k) != v}
    if config.n_kv_head not in (0, config.n_head):
        other["n_kv_head"] = config.n_kv_head
    if other:
        raise ConversionError(
            f"HF TransfoXL has the paper's block only (post- or pre-LayerNorm, a ReLU feed-forward with biases, every "
            f"head its own keys and values, no caps); this model has {', '.join(f'{k}={v}' for k, v in other.items())}"
        )
    if len(set(ties[1:])) > 1 or ties[0]:
        raise ConversionError(f"tie_projs={ties} has no HF equivalent: HF ties all projections but the first, or none")
    return {
        "model_type": "transfo-xl",
        "architectures": ["TransfoXLLMHeadModel"],
        "vocab_size": config.vocab_size,
        "cutoffs": list(config.cutoffs),
        "d_model": config.d_model,
        "d_embed": config.embed_dim,
        "n_head": config.n_head,
        "d_head": config.d_head,
        "d_inner": config.d_inner,
        "div_val": config.div_val,
        "pre_lnorm": config.pre_lnorm,
        "n_layer": config.n_layer,
        "mem_len": config.memory.mem_len,
        "clamp_len": config.positions.clamp_len,
        "same_length": config.memory.same_length,
        "proj_share_all_but_first": bool(ties[1]) if len(ties) > 1 else True,
        "attn_type": 0,
        "sample_softmax": -1,
        "adaptive": True,
        "dropout": config.dropout,
        "dropatt": config.dropatt,
        "untie_r": config.untie_r,
        "init": "normal",
        "init_range": 0.01,
        "proj_init_std": config.proj_init_std,
        "init_std": config.init_std,
        "layer_norm_epsilon": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_weight,
        "eos_token_id": 0,
    }


_UNTIED_BIAS = re.compile(r"transformer\.layers\.(\d+)\.dec_attn\.(r_[wr]_bias)$")


def state_dict_from_hf(hf_state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename HF tensors to longseq names, stacking per-layer u/v when ``untie_r``; shapes are checked."""
    target = TransformerXLLM(config).state_dict()
    out: dict[str, torch.Tensor] = {}
    biases: dict[str, dict[int, torch.Tensor]] = {"r_w_bias": {}, "r_r_bias": {}}
    for name, tensor in hf_state.items():
        if name.endswith("pos_emb.inv_freq"):
            continue
        match = _UNTIED_BIAS.match(name)
        if match:
            if config.untie_r:
                biases[match.group(2)][int(match.group(1))] = tensor
            elif f"transformer.{match.group(2)}" in hf_state and not torch.equal(
                tensor, hf_state[f"transformer.{match.group(2)}"]
            ):
                raise ConversionError(f"{name} differs from transformer.{match.group(2)} although untie_r is false")
            continue  # with shared u/v, HF's .bin repeats them under every layer's name
        ours = _longseq_name(name)
        if ours not in target:
            raise ConversionError(f"HF tensor {name} has no counterpart in longseq's TransformerXLLM for this config")
        out[ours] = tensor
    for kind, per_layer in biases.items():
        if per_layer:
            if sorted(per_layer) != list(range(config.n_layer)):
                raise ConversionError(
                    f"per-layer {kind} found for layers {sorted(per_layer)}, expected 0..{config.n_layer - 1}"
                )
            out[f"transformer.stack.{kind}"] = torch.stack([per_layer[i] for i in range(config.n_layer)])
    for name, tensor in out.items():
        if tuple(tensor.shape) != tuple(target[name].shape):
            raise ConversionError(
                f"shape mismatch for {name}: checkpoint has {tuple(tensor.shape)}, the config expects {tuple(target[name].shape)}"
            )
    tied = _tied_names(config)
    missing = sorted(set(target) - set(out) - tied)
    if missing:
        raise ConversionError(f"the HF checkpoint lacks {missing}")
    return out


def _longseq_name(hf_name: str) -> str:
    """longseq's name of an HF TransfoXL tensor (the table in the module docstring)."""
    name = hf_name.replace(".pos_ff.CoreNet.", ".pos_ff.core_net.").replace(".dec_attn.r_net.", ".dec_attn.rel.r_net.")
    if name.startswith("transformer.") and not name.startswith("transformer.word_emb."):
        return "transformer.stack." + name.removeprefix("transformer.")
    return name


def _hf_name(name: str) -> str:
    """HF's name of a longseq tensor (the inverse of :func:`_longseq_name`)."""
    name = name.replace(".pos_ff.core_net.", ".pos_ff.CoreNet.").replace(".dec_attn.rel.r_net.", ".dec_attn.r_net.")
    return name.replace("transformer.stack.", "transformer.", 1)


def _tied_names(config: ModelConfig) -> set[str]:
    names = set()
    if config.tie_weight:
        names |= {f"crit.out_layers.{i}.weight" for i in range(1 if config.div_val == 1 else len(config.cutoffs) + 1)}
    for i, tie in enumerate(config.proj_ties):
        if tie and (config.div_val != 1 or config.d_model != config.embed_dim):
            names.add(f"crit.out_projs.{i}")
    return names


def state_dict_to_hf(model: TransformerXLLM) -> dict[str, torch.Tensor]:
    """HF names for every tensor of ``model`` (tied tensors written out under each name, as HF's ``.bin`` does)."""
    config = model.config
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=False).items():
        tensor = tensor.detach().clone().contiguous()
        if name in ("transformer.stack.r_w_bias", "transformer.stack.r_r_bias"):
            kind = name.split(".")[-1]
            for i in range(config.n_layer):  # HF names u/v under every layer, shared (untie_r=False) or not
                out[f"transformer.layers.{i}.dec_attn.{kind}"] = (tensor[i] if config.untie_r else tensor).clone()
            if config.untie_r:
                continue
        out[_hf_name(name)] = tensor
    out["transformer.pos_emb.inv_freq"] = 1 / (10000 ** (torch.arange(0.0, config.d_model, 2.0) / config.d_model))
    for i, layer in enumerate(model.crit.out_layers):  # state_dict() keeps tied names; make sure all are present
        out.setdefault(f"crit.out_layers.{i}.weight", layer.weight.detach().clone())
    return out


def read_hf_weights(directory: str) -> dict[str, torch.Tensor]:
    """Tensors of an HF checkpoint: safetensors preferred; ``.bin`` only through ``weights_only=True``."""
    safetensors_path = os.path.join(directory, "model.safetensors")
    bin_path = os.path.join(directory, "pytorch_model.bin")
    if os.path.isfile(safetensors_path):
        try:
            return load_file(safetensors_path)
        except SafetensorError as exc:
            raise ConversionError(f"cannot read {safetensors_path}: {exc}") from None
    if os.path.isfile(bin_path):
        try:
            state = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError ... on bad files
            raise ConversionError(f"cannot read {bin_path} as plain tensors (weights_only=True): {exc}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ConversionError(f"{bin_path} does not hold a flat dict of tensors")
        return state
    raise ConversionError(f"{directory} has neither model.safetensors nor pytorch_model.bin")


def read_vocab(path: str) -> WordTokenizer:
    """A plain-text vocabulary, one token per line in id order, as a word tokenizer."""
    try:
        with open(path, encoding="utf-8") as f:
            words = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConversionError(f"cannot read vocabulary {path}: {exc}") from None
    if words and words[-1] == "":
        words.pop()
    for special in (EOS, UNK):
        if special not in words:
            raise ConversionError(
                f"vocabulary {path} lacks {special}; a TransfoXL word vocabulary has both {EOS} and {UNK}"
            )
    return WordTokenizer(words)


def load_hf(directory: str) -> TransformerXLLM:
    """Build a longseq model from an HF TransfoXL checkpoint directory (in eval mode)."""
    config = model_config_from_hf(_read_hf_config(directory))
    weights = read_hf_weights(directory)
    refuse_cast_weights({name: str(tensor.dtype) for name, tensor in weights.items()}, directory)  # all float
    state = state_dict_from_hf(weights, config)
    model = TransformerXLLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    leftover = sorted(set(missing) - _tied_names(config))
    if leftover or unexpected:
        raise ConversionError(f"weights do not match: missing {leftover}, unexpected {sorted(unexpected)}")
    model.tie_weights()
    refuse_non_finite(model, directory)
    return model.eval()


def refuse_non_finite(model: torch.nn.Module, where: str) -> None:
    """A :class:`ConversionError` when a floating-point weight of ``model`` holds NaN or Inf (read from ``where``):
    such a model scores NaN and generates one token forever, and longseq's own loader refuses it."""
    tensors = [*model.named_parameters(), *model.named_buffers()]  # a tied weight once
    broken = [name for name, tensor in tensors if tensor.is_floating_point() and not bool(tensor.isfinite().all())]
    if broken:
        raise ConversionError(
            f"{where} holds NaN or Inf weights in {len(broken)} tensor(s) ({', '.join(broken[:3])}"
            f"{', ...' if len(broken) > 3 else ''}): the model cannot be used; take an earlier checkpoint"
        )


def stored_dtypes(path: str) -> dict[str, str]:
    """The dtype a safetensors file records for each of its tensors (``F32``, ``I64``, ...), read from its header."""
    with safe_open(path, "pt") as f:
        return {name: f.get_slice(name).get_dtype() for name in f.keys()}


def float_weights(model: torch.nn.Module, prefix: str = "") -> set[str]:
    """The names (after ``prefix``) of ``model``'s floating-point weights and buffers."""
    return {prefix + name for name, tensor in model.state_dict().items() if tensor.is_floating_point()}


def refuse_cast_weights(dtypes: dict[str, str], where: str, floats: set[str] | None = None) -> None:
    """A :class:`ConversionError` naming the stored tensors (``dtypes``: each name as the file has it, and its dtype
    as torch or safetensors writes it) that hold integers or booleans where the model has a floating-point weight
    (``floats``, those names; None: every tensor): loading would copy them in, cast without a word."""
    wrong = [
        f"{name} ({dtype})"
        for name, dtype in dtypes.items()
        if (floats is None or name in floats) and not dtype.lower().startswith(("f", "bf", "torch.float", "torch.bf"))
    ]
    if wrong:
        raise ConversionError(
            f"{where} holds {len(wrong)} tensor(s) of integers or booleans where the model has floating-point "
            f"weights: {', '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''}; they would be cast silently, so "
            "the file is refused: it was not saved from a model's weights"
        )


def exported_by_longseq(directory: str) -> bool:
    """Whether ``directory`` holds an export ``longseq convert`` wrote (its ``model.safetensors`` says so)."""
    try:
        with safe_open(os.path.join(directory, "model.safetensors"), "pt") as f:
            return (f.metadata() or {}).get("exported_by") == EXPORTED_BY
    except (OSError, SafetensorError, ValueError):
        return False


def check_export_directory(out: str, names: tuple[str, ...]) -> None:
    """``out`` may receive an export of the files ``names``: it is new, empty, or an earlier export of convert
    (refused by name otherwise: a checkpoint, a run, a model someone else saved)."""
    own = lambda path: exported_by_longseq(os.path.dirname(path))  # noqa: E731
    check_output_directory(out, "--out", "an export", {name: own for name in names})


def convert_from_hf(directory: str, vocab: str | None = None) -> tuple[TransformerXLLM, Tokenizer, RunConfig]:
    """The longseq model, tokenizer and run config of an HF TransfoXL directory (save them with
    :func:`longseq.train.checkpoint.save_checkpoint`)."""
    hf = _read_hf_config(directory)
    model = load_hf(directory)
    tokenizer: Tokenizer
    if vocab is not None:
        tokenizer = read_vocab(vocab)
        if tokenizer.vocab_size != model.config.vocab_size:
            raise ConversionError(
                f"vocabulary {vocab} has {tokenizer.vocab_size} tokens, the model {model.config.vocab_size}"
            )
    elif model.config.vocab_size == 256:
        tokenizer = ByteTokenizer()
    else:
        raise ConversionError(
            f"a {model.config.vocab_size}-token model needs its vocabulary: pass --vocab FILE (one token per line, in id order)"
        )
    tgt_len = int(hf.get("tgt_len", 128) or 128)
    run = RunConfig(
        model=model.config,
        data=DataConfig(tokenizer=tokenizer.kind, tgt_len=tgt_len, eval_tgt_len=tgt_len),
        train=TrainConfig(),
    )
    return model, tokenizer, run


TRANSFO_XL_FILES = ("config.json", "model.safetensors", "vocab.txt")  # what export_to_hf writes


def export_to_hf(model: TransformerXLLM, out: str, tokenizer: Tokenizer | None = None) -> None:
    """Write an HF TransfoXL directory (``config.json`` + ``model.safetensors``) that transformers 4.x loads."""
    if not isinstance(model, TransformerXLLM):
        raise ConversionError(
            f"only a language model exports to HF TransfoXL; this is a {type(model).__name__} (a fine-tuned or "
            "LSTM model)"
        )
    config = hf_config_from_model(model.config)  # checked before anything is written
    check_export_directory(out, TRANSFO_XL_FILES)
    tensors = state_dict_to_hf(model)

    def write(directory: str) -> None:
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        save_file(tensors, os.path.join(directory, "model.safetensors"), metadata=EXPORT_METADATA)
        if isinstance(tokenizer, WordTokenizer):
            with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(tokenizer.words) + "\n")

    write_directory(out, write, "the export", (SafetensorError,))  # whole or not at all: a full disk leaves none
