"""Llama-family checkpoints in and out: Llama, Mistral, Qwen2 and Qwen3 in transformers' layout (``config.json``
and safetensors, sharded too), read onto longseq's ``llama-xl`` block and written back.

Every field these families' transformers configs declare is mapped, or refused by name before any weight is read
(:data:`MAPPED`, :data:`IGNORED`; ``tests/test_pretrained.py`` holds the lists to the installed transformers):

    vocab_size, hidden_size, intermediate_size      -> vocab_size, d_model, d_inner
    num_hidden_layers, num_attention_heads          -> n_layer, n_head
    num_key_value_heads, head_dim                   -> n_kv_head (grouped-query attention), d_head
    rms_norm_eps                                    -> layer_norm_eps (norm=rmsnorm, pre_lnorm, final_norm)
    hidden_act = silu                               -> ff=swiglu (anything else is refused)
    tie_word_embeddings                             -> tie_weight (head_bias=false, embed_scale=false)
    attention_bias (Llama, Qwen3: q, k, v and o)    -> qkv_bias and attn_out_bias
    Qwen2's q, k, v biases (always)                 -> qkv_bias
    mlp_bias (Llama)                                -> bias
    Qwen3's q_norm, k_norm                          -> qk_norm
    rope_parameters (rope_theta, rope_type: default, linear, dynamic, llama3, yarn, their factors)
                                                    -> positions (pos=rope, rope_scaling, rope_*)
    sliding_window (Mistral: every layer)           -> pattern.attention=window, pattern.window
    layer_types (Qwen2, Qwen3: full_attention | sliding_attention per layer; use_sliding_window,
                 max_window_layers)                 -> pattern.attention per layer (full | window)
    max_position_embeddings                         -> memory.mem_len + the segment (tgt_len), see below
    attention_dropout, initializer_range            -> dropatt, init_std

Refused by name: another ``model_type`` (a mixture of experts: mixtral, qwen2_moe, qwen3_moe ...), another
activation, rope kinds longseq lacks (longrope, ...), a partial rotary factor, per-layer attention kinds longseq lacks,
quantized weights (``quantization_config``), experts' fields.  ``bos_token_id``, ``eos_token_id``, ``pad_token_id``,
``use_cache`` and ``pretraining_tp`` (which transformers 5's models do not read) change no logit.

**The context.**  A model trained on ``max_position_embeddings`` = P tokens reads in segments of T = min(512, P // 2)
tokens with a key/value memory of ``mem_len`` = P - T: a query sees at most P keys, and a text of up to P tokens
read in segments scores as the model's own full attention over it.  Exporting writes P = mem_len + tgt_len back.

**Weights** (transformers -> longseq, layer i; q, k, v stacked in ``qkv_net``, gate and up in the gated
feed-forward's first linear, gate first)::

    model.embed_tokens.weight                   -> transformer.word_emb.emb_layers.0.weight
    model.layers.i.input_layernorm.weight       -> transformer.stack.layers.i.dec_attn.layer_norm.weight
    model.layers.i.self_attn.{q,k,v}_proj.*     -> transformer.stack.layers.i.dec_attn.qkv_net.*
    model.layers.i.self_attn.o_proj.*           -> transformer.stack.layers.i.dec_attn.o_net.*
    model.layers.i.self_attn.{q,k}_norm.weight  -> transformer.stack.layers.i.dec_attn.{q,k}_norm.weight
    model.layers.i.post_attention_layernorm.weight -> transformer.stack.layers.i.pos_ff.layer_norm.weight
    model.layers.i.mlp.{gate,up}_proj.*         -> transformer.stack.layers.i.pos_ff.core_net.0.*
    model.layers.i.mlp.down_proj.*              -> transformer.stack.layers.i.pos_ff.core_net.3.*
    model.norm.weight                           -> transformer.final_norm.weight
    lm_head.weight                              -> crit.out_layers.0.weight (untied; tied: the embedding)

Weights are read in float32 (bfloat16 and float16 exactly).  Reading the config needs transformers (the ``hf``
extra: its config classes give every field's default); the weights are read with safetensors alone.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from longseq.config import ConfigError, ModelConfig
from longseq.config.model import MemoryConfig, PatternConfig, PositionConfig
from longseq.interop.transfo_xl import ConversionError, refuse_non_finite
from longseq.model import TransformerXLLM
from longseq.model.attention.patterns import layer_patterns


@dataclass(frozen=True)
class Family:
    """A model type this module reads: its transformers class, and what its layers have of their own."""

    architecture: str
    qkv_bias: bool = False  # q, k, v biases whatever the config says (Qwen2)
    qk_norm: bool = False  # RMSNorm of every query and key head (Qwen3)
    layer_types: bool = False  # a sliding window chosen per layer (Qwen2, Qwen3)
    sliding: bool = False  # one sliding window for every layer (Mistral)


FAMILIES = {
    "llama": Family("LlamaForCausalLM"),
    "mistral": Family("MistralForCausalLM", sliding=True),
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True, layer_types=True),
    "qwen3": Family("Qwen3ForCausalLM", qk_norm=True, layer_types=True),
}
REFUSED_TYPES = {
    "mixtral": "a mixture of experts",
    "qwen2_moe": "a mixture of experts",
    "qwen3_moe": "a mixture of experts",
    "gemma": "Gemma's norm (1 + weight) and scaled embedding",
    "gemma2": "Gemma's norm (1 + weight), soft caps and alternating layers",
    "phi3": "a fused qkv projection and partial rotary positions",
    "smollm3": "layers without positions (no_rope_layers)",
}
MAPPED = {
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
    "attention_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "attention_dropout",
    "initializer_range",
}
IGNORED = {"bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "use_cache", "pretraining_tp"}
REFUSED_KEYS = {
    "quantization_config": "quantized weights (load them in transformers and save them unquantized)",
    "num_experts": "a mixture of experts",
    "num_local_experts": "a mixture of experts",
    "num_experts_per_tok": "a mixture of experts",
    "moe_intermediate_size": "a mixture of experts",
    "no_rope_layers": "layers without positions",
    "partial_rotary_factor": "partial rotary positions",
}
ROPE_KEYS = {  # transformers' rope_type -> the rope_parameters it reads (and longseq's rope_scaling)
    "default": ("none", set()),
    "linear": ("linear", {"factor"}),
    "dynamic": ("dynamic", {"factor"}),
    "llama3": ("llama3", {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
    "yarn": (
        "yarn",
        {
            "factor",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "original_max_position_embeddings",
            "truncate",
        },
    ),
}
SEGMENT = 512  # the longest segment an imported model reads at once (tgt_len)


def refuse_model_type(model_type, where: str) -> Family:
    """The family of ``model_type``, or a :class:`ConversionError` naming it (and what longseq lacks for it)."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    reason = f": {REFUSED_TYPES[model_type]}, which longseq does not implement" if model_type in REFUSED_TYPES else ""
    raise ConversionError(
        f"{where}: model_type {model_type!r} is not supported{reason}; longseq imports {', '.join(FAMILIES)} "
        "(and the longseq and TransfoXL formats)"
    )


def read_config_file(folder: str) -> dict:
    """``folder/config.json`` as a dict, or a :class:`ConversionError` naming the file."""
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConversionError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise ConversionError(f"{path} is not a JSON object")
    return config


def transformers_config(raw: dict, where: str):
    """The family's transformers config of ``raw`` (every field a value: the file's or the class default), after
    refusing what longseq does not implement by name."""
    family = refuse_model_type(raw.get("model_type"), where)
    refused = {key: REFUSED_KEYS[key] for key in raw if key in REFUSED_KEYS and raw[key] not in (None, 1.0, [], {})}
    if refused:
        listed = "; ".join(f"{key} ({why})" for key, why in refused.items())
        raise ConversionError(f"{where} sets {listed}: longseq does not implement it")
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ConversionError(
            f"reading a {raw['model_type']} config needs transformers: pip install 'longseq[hf]'"
        ) from None
    refuse_rope_type(raw.get("rope_parameters") or raw.get("rope_scaling") or {}, where)
    try:
        config = AutoConfig.for_model(**raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConversionError(f"{where}: transformers refuses this config: {exc}") from None
    unmapped = sorted(set(raw) & (declared_fields(raw["model_type"]) - MAPPED - IGNORED))
    if unmapped:
        raise ConversionError(f"{where} sets {', '.join(unmapped)}, which longseq's import does not map ({family})")
    return config


def declared_fields(model_type: str) -> set[str]:
    """The fields the family's transformers config declares beyond every config's own (which change no logit)."""
    from transformers import AutoConfig, PreTrainedConfig

    return set(AutoConfig.for_model(model_type).to_dict()) - set(PreTrainedConfig().to_dict())


def refuse_rope_type(rope, where: str) -> str:
    """The rope kind of ``rope_parameters`` (or an older config's ``rope_scaling``), refused by name unless longseq
    implements it."""
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
    if kind not in ROPE_KEYS:
        raise ConversionError(
            f"{where}: rope_type {kind!r} is not implemented in longseq (it has {', '.join(ROPE_KEYS)})"
        )
    return kind


def rope_positions(rope: dict, max_positions: int, where: str) -> PositionConfig:
    """longseq's positions for transformers' ``rope_parameters`` (refused by name: another kind, a field it lacks)."""
    kind = refuse_rope_type(rope, where)
    scaling, reads = ROPE_KEYS[kind]
    stray = sorted(set(rope) - reads - {"rope_type", "rope_theta", "partial_rotary_factor"})
    if stray or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConversionError(
            f"{where}: rope_parameters {stray or 'partial_rotary_factor'} of rope_type {kind!r} "
            "are not implemented in longseq"
        )
    original = int(rope.get("original_max_position_embeddings") or max_positions)
    factor = rope.get("factor")
    if kind == "yarn" and factor is None:
        factor = max_positions / original
    options = {"rope_theta": float(rope["rope_theta"]), "rope_scaling": scaling, "rope_factor": float(factor or 1.0)}
    if kind == "dynamic":
        options["rope_original_len"] = max_positions
    if kind == "llama3":
        options.update(
            rope_original_len=original,
            rope_low_freq_factor=float(rope["low_freq_factor"]),
            rope_high_freq_factor=float(rope["high_freq_factor"]),
        )
    if kind == "yarn":
        options.update(
            rope_original_len=original,
            rope_beta_fast=float(rope.get("beta_fast") or 32),
            rope_beta_slow=float(rope.get("beta_slow") or 1),
            rope_attention_factor=yarn_attention_factor(rope, options["rope_factor"]),
            rope_truncate=bool(rope.get("truncate", True)),
        )
    return PositionConfig(pos="rope", **options)


def yarn_attention_factor(rope: dict, factor: float) -> float:
    """transformers' YaRN attention factor: given, or from ``mscale`` and ``mscale_all_dim``, or 0.1 ln(factor) + 1."""
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if mscale and all_dim:
        return float(get_mscale(factor, mscale) / get_mscale(factor, all_dim))
    return get_mscale(factor)


def attention_patterns(hf, family: Family, where: str) -> PatternConfig:
    """One sliding window for every layer (Mistral), or per layer (Qwen2, Qwen3's ``layer_types``), as longseq's
    ``window`` pattern (the ``window`` nearest keys, the query's own among them, as transformers' mask)."""
    window = getattr(hf, "sliding_window", None)
    if family.sliding:
        return PatternConfig(attention=["window"], window=window) if window else PatternConfig()
    if not family.layer_types:
        return PatternConfig()
    kinds = {"full_attention": "full", "sliding_attention": "window"}
    stray = sorted({kind for kind in hf.layer_types if kind not in kinds})
    if stray:
        raise ConversionError(f"{where}: layer_types {stray} are attention kinds longseq lacks (it has {list(kinds)})")
    names = [kinds[kind] for kind in hf.layer_types]
    if any(kind == "sliding_attention" for kind in hf.layer_types) and not window:
        raise ConversionError(f"{where}: layer_types has sliding_attention layers but sliding_window is {window!r}")
    return PatternConfig(attention=names if len(set(names)) > 1 else names[:1], window=window or 256)


def context_split(max_positions: int) -> tuple[int, int]:
    """(tgt_len, mem_len) for a model trained on ``max_positions`` tokens: together its context."""
    segment = max(1, min(SEGMENT, max_positions // 2))
    return segment, max_positions - segment


def model_config(hf, where: str) -> tuple[ModelConfig, int]:
    """longseq's model config of a Llama-family transformers config, and the segment length it reads."""
    family = refuse_model_type(hf.model_type, where)
    if hf.hidden_act != "silu":
        raise ConversionError(f"{where}: hidden_act={hf.hidden_act!r}; longseq's swiglu feed-forward is silu's")
    n_head = hf.num_attention_heads
    attention_bias = bool(getattr(hf, "attention_bias", False))
    tgt_len, mem_len = context_split(hf.max_position_embeddings)
    try:
        config = ModelConfig(
            vocab_size=hf.vocab_size,
            n_layer=hf.num_hidden_layers,
            d_model=hf.hidden_size,
            n_head=n_head,
            n_kv_head=hf.num_key_value_heads or n_head,
            d_head=getattr(hf, "head_dim", None) or hf.hidden_size // n_head,
            d_inner=hf.intermediate_size,
            dropout=0.0,
            dropatt=float(hf.attention_dropout or 0.0),
            pre_lnorm=True,
            final_norm=True,
            norm="rmsnorm",
            ff="swiglu",
            bias=bool(getattr(hf, "mlp_bias", False)),
            qkv_bias=family.qkv_bias or attention_bias,
            attn_out_bias=attention_bias,
            head_bias=False,
            embed_scale=False,
            qk_norm=family.qk_norm,
            tie_weight=bool(hf.tie_word_embeddings),
            init_std=float(hf.initializer_range),
            layer_norm_eps=float(hf.rms_norm_eps),
            memory=MemoryConfig(mem_len=mem_len),
            pattern=attention_patterns(hf, family, where),
            positions=rope_positions(dict(hf.rope_parameters), hf.max_position_embeddings, where),
        )
    except ConfigError as exc:
        raise ConversionError(f"{where}: the config cannot be represented in longseq: {exc}") from None
    return config, tgt_len


# -- weights ------------------------------------------------------------------------------------------------------


def layer_names(config: ModelConfig, i: int) -> dict[str, list[str]]:
    """longseq's tensor of layer ``i`` -> the transformers tensors stacked into it, in order."""
    hf, ours = f"model.layers.{i}.", f"transformer.stack.layers.{i}."
    attn, mlp = hf + "self_attn.", hf + "mlp."
    names = {
        ours + "dec_attn.qkv_net.weight": [attn + f"{x}_proj.weight" for x in "qkv"],
        ours + "dec_attn.o_net.weight": [attn + "o_proj.weight"],
        ours + "dec_attn.layer_norm.weight": [hf + "input_layernorm.weight"],
        ours + "pos_ff.layer_norm.weight": [hf + "post_attention_layernorm.weight"],
        ours + "pos_ff.core_net.0.weight": [mlp + "gate_proj.weight", mlp + "up_proj.weight"],
        ours + "pos_ff.core_net.3.weight": [mlp + "down_proj.weight"],
    }
    if config.qkv_bias:
        names[ours + "dec_attn.qkv_net.bias"] = [attn + f"{x}_proj.bias" for x in "qkv"]
    if config.attn_out_bias:
        names[ours + "dec_attn.o_net.bias"] = [attn + "o_proj.bias"]
    if config.qk_norm:
        names[ours + "dec_attn.q_norm.weight"] = [attn + "q_norm.weight"]
        names[ours + "dec_attn.k_norm.weight"] = [attn + "k_norm.weight"]
    if config.bias:
        names[ours + "pos_ff.core_net.0.bias"] = [mlp + "gate_proj.bias", mlp + "up_proj.bias"]
        names[ours + "pos_ff.core_net.3.bias"] = [mlp + "down_proj.bias"]
    return names


def weight_names(config: ModelConfig) -> dict[str, list[str]]:
    """Every longseq tensor of ``config`` -> the transformers tensors it is made of (the module docstring's table)."""
    names = {"transformer.word_emb.emb_layers.0.weight": ["model.embed_tokens.weight"]}
    for i in range(config.n_layer):
        names.update(layer_names(config, i))
    names["transformer.final_norm.weight"] = ["model.norm.weight"]
    if not config.tie_weight:
        names["crit.out_layers.0.weight"] = ["lm_head.weight"]
    return names


def state_dict_from_hf(weights: dict[str, torch.Tensor], config: ModelConfig, where: str) -> dict[str, torch.Tensor]:
    """longseq's state dict of transformers' tensors (float32); a missing or unexpected tensor is named."""
    weights = {name: tensor for name, tensor in weights.items() if not name.endswith("rotary_emb.inv_freq")}
    if config.tie_weight:
        weights.pop("lm_head.weight", None)  # transformers ties it to the embedding, as longseq does
    names = weight_names(config)
    missing = sorted(name for parts in names.values() for name in parts if name not in weights)
    unexpected = sorted(set(weights) - {name for parts in names.values() for name in parts})
    if missing or unexpected:
        raise ConversionError(
            f"{where}: the weights do not fit the config: missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
        )
    return {ours: torch.cat([weights[name].float() for name in parts]) for ours, parts in names.items()}


def state_dict_to_hf(model: TransformerXLLM) -> dict[str, torch.Tensor]:
    """transformers' tensors of ``model`` (the inverse of :func:`state_dict_from_hf`; a tied head once, as
    ``save_pretrained`` writes it)."""
    config, state = model.config, model.state_dict()
    q_width, kv_width = config.n_head * config.d_head, (config.n_kv_head or config.n_head) * config.d_head
    out = {}
    for ours, parts in weight_names(config).items():
        tensor = state[ours].detach().cpu()
        if len(parts) == 3:
            pieces = tensor.split((q_width, kv_width, kv_width))
        else:
            pieces = tensor.chunk(len(parts))
        out.update({name: piece.contiguous().clone() for name, piece in zip(parts, pieces)})
    return out


def read_folder_weights(folder: str) -> dict[str, torch.Tensor]:
    """The tensors of a transformers folder: ``model.safetensors``, or the shards ``model.safetensors.index.json``
    names; ``pytorch_model.bin`` (and its index) through ``torch.load(weights_only=True)`` only."""
    for index_name, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        index = os.path.join(folder, index_name)
        if os.path.isfile(index):
            try:
                with open(index, encoding="utf-8") as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ConversionError(f"cannot read {index} (a weight_map of tensor -> shard): {exc}") from None
            weights = {}
            for shard in shards:
                weights.update(read_weight_file(os.path.join(folder, shard)))
            return weights
        if os.path.isfile(os.path.join(folder, single)):
            return read_weight_file(os.path.join(folder, single))
    raise ConversionError(f"{folder} has no model.safetensors (nor its index, nor pytorch_model.bin)")


def read_weight_file(path: str) -> dict[str, torch.Tensor]:
    """One safetensors file, or a ``.bin`` of plain tensors (``weights_only=True``)."""
    if path.endswith(".safetensors"):
        try:
            return load_file(path)
        except (OSError, SafetensorError) as exc:
            raise ConversionError(f"cannot read {path} (missing, truncated, or not safetensors): {exc}") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError ... on bad files
        raise ConversionError(f"cannot read {path} as plain tensors (weights_only=True): {exc}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConversionError(f"{path} does not hold a flat dict of tensors")
    return state


def build_from_hf(config: ModelConfig, weights: dict[str, torch.Tensor], where: str) -> TransformerXLLM:
    """The longseq model of ``config`` holding transformers' ``weights`` (eval mode, float32)."""
    model = TransformerXLLM(config)
    try:
        model.load_state_dict(state_dict_from_hf(weights, config, where), strict=not config.tie_weight)
    except RuntimeError as exc:  # a tensor of another shape than the config's
        raise ConversionError(f"{where}: the weights do not fit the config: {exc}") from None
    model.tie_weights()
    refuse_non_finite(model, where)
    return model.eval()


def load_llama_folder(folder: str) -> tuple[TransformerXLLM, int, dict]:
    """The longseq model of a Llama-family transformers folder, its segment length (tgt_len), and its transformers
    config as a dict.  Everything longseq does not implement is refused by name before a weight is read."""
    raw = read_config_file(folder)
    where = os.path.join(folder, "config.json")
    hf = transformers_config(raw, where)
    config, tgt_len = model_config(hf, where)
    model = build_from_hf(config, read_folder_weights(folder), folder)
    return model, tgt_len, hf.to_dict()


# -- export -------------------------------------------------------------------------------------------------------

BLOCK = {  # what every Llama-family model is, in longseq's options
    "arch": "transformer",
    "pre_lnorm": True,
    "final_norm": True,
    "norm": "rmsnorm",
    "ff": "swiglu",
    "head_bias": False,
    "embed_scale": False,
    "attn_softcap": 0.0,
    "logit_softcap": 0.0,
    "cutoffs": [],
    "div_val": 1,
}
FAMILY_BLOCK = {  # and what each family's layers are
    "llama": {"qk_norm": False},
    "mistral": {"qk_norm": False, "qkv_bias": False, "attn_out_bias": False, "bias": False},
    "qwen2": {"qk_norm": False, "qkv_bias": True, "attn_out_bias": False, "bias": False},
    "qwen3": {"qk_norm": True, "bias": False},
}


def sliding_windows(config: ModelConfig) -> tuple[list[int | None], list[str]]:
    """Each layer's attention as transformers has it, read from the pattern registry's data: None (every key before
    the query) or a sliding window of that many keys (a band that it fills, no global tokens); and the names of the
    patterns transformers has no kind for."""
    windows, other = [], []
    for pattern in layer_patterns(config):
        if pattern.has_global or not pattern.is_band:
            other.append(pattern.name)
        else:
            windows.append(None if pattern.is_full else pattern.reach + 1)
    return windows, other


def family_of(config: ModelConfig) -> str:
    """The family a model's layers fit, by what it has of its own: QK-norm (qwen3), q/k/v biases without an output
    bias (qwen2), a window in every layer (mistral), else llama."""
    if config.qk_norm:
        return "qwen3"
    if config.qkv_bias and not config.attn_out_bias:
        return "qwen2"
    windows, other = sliding_windows(config)
    return "mistral" if not other and None not in windows else "llama"


def refuse_unexportable(config: ModelConfig, model_type: str) -> None:
    """A :class:`ConversionError` naming every option of ``config`` that ``model_type``'s transformers model lacks."""
    family = refuse_model_type(model_type, "--format")
    wanted = {**BLOCK, **FAMILY_BLOCK[model_type]}
    other = [f"{key}={getattr(config, key)!r}" for key, value in wanted.items() if getattr(config, key) != value]
    if config.embed_dim != config.d_model:
        other.append(f"d_embed={config.d_embed}")
    if set(config.layer_mixers) != {"attention"} or config.hourglass.shorten_layers:
        other.append(f"mixer={','.join(config.mixer)}, shorten_layers={config.hourglass.shorten_layers}")
    if config.positions.pos != "rope" or config.positions.rope_scaling == "ntk":
        other.append(f"positions.pos={config.positions.pos}, rope_scaling={config.positions.rope_scaling}")
    (sizes, stray), p = sliding_windows(config), config.pattern
    kinds = set(sizes)  # full attention (None) and sliding windows of these sizes
    one_kind = family.sliding and len(kinds) == 1  # Mistral: one kind for every layer
    if stray or len(kinds - {None}) > 1 or not (one_kind or family.layer_types or kinds == {None}):
        other.append(f"pattern.attention={','.join(p.attention)}")
    if p.bidirectional or p.lowrank or config.memory.mem_tokens or config.memory.cmem_len:
        other.append("bidirectional, lowrank, memory tokens or a compressed memory")
    if model_type == "llama" and config.qkv_bias != config.attn_out_bias:
        other.append(f"qkv_bias={config.qkv_bias} with attn_out_bias={config.attn_out_bias} (Llama's attention_bias)")
    if model_type == "qwen3" and config.qkv_bias != config.attn_out_bias:
        other.append(f"qkv_bias={config.qkv_bias} with attn_out_bias={config.attn_out_bias} (Qwen3's attention_bias)")
    if other:
        raise ConversionError(f"{model_type}'s transformers model cannot hold this model: {'; '.join(other)}")


def rope_parameters(positions: PositionConfig, d_head: int) -> dict:
    """transformers' ``rope_parameters`` of longseq's rope options (the inverse of :func:`rope_positions`)."""
    from longseq.model.positions import Shape, yarn_attention_factor

    kind = {scaling: kind for kind, (scaling, _) in ROPE_KEYS.items()}[positions.rope_scaling]
    rope = {"rope_type": kind, "rope_theta": positions.rope_theta}
    if kind != "default":
        rope["factor"] = positions.rope_factor
    if kind == "llama3":
        rope.update(
            low_freq_factor=positions.rope_low_freq_factor,
            high_freq_factor=positions.rope_high_freq_factor,
            original_max_position_embeddings=positions.rope_original_len,
        )
    if kind == "yarn":
        shape = Shape(d_head, 1, d_head, **{k: getattr(positions, k) for k in ("rope_factor", "rope_attention_factor")})
        rope.update(
            attention_factor=yarn_attention_factor(shape),
            beta_fast=positions.rope_beta_fast,
            beta_slow=positions.rope_beta_slow,
            original_max_position_embeddings=positions.rope_original_len,
            truncate=positions.rope_truncate,
        )
    return rope


def hf_config_of(config: ModelConfig, model_type: str, context: int) -> dict:
    """The ``config.json`` of ``model_type``'s transformers model for ``config`` (refused by name if it cannot hold
    it), its context ``context`` tokens (``max_position_embeddings``; dynamic rope: the context it scales from)."""
    refuse_unexportable(config, model_type)
    family, p = FAMILIES[model_type], config.positions
    hf = {
        "model_type": model_type,
        "architectures": [family.architecture],
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_inner,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head or config.n_head,
        "head_dim": config.d_head,
        "hidden_act": "silu",
        "max_position_embeddings": p.rope_original_len if p.rope_scaling == "dynamic" else context,
        "rms_norm_eps": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_weight,
        "rope_parameters": rope_parameters(p, config.d_head),
        "attention_dropout": config.dropatt,
        "initializer_range": config.init_std,
        "dtype": "float32",
    }
    if model_type in ("llama", "qwen3"):
        hf["attention_bias"] = config.attn_out_bias
    if model_type == "llama":
        hf["mlp_bias"] = config.bias
    sizes = sliding_windows(config)[0]
    windows = [size is not None for size in sizes]
    window = next((size for size in sizes if size is not None), None)
    if family.sliding:
        hf["sliding_window"] = window
    if family.layer_types:
        hf.update(
            use_sliding_window=any(windows),
            sliding_window=window,
            max_window_layers=windows.index(True) if any(windows) else config.n_layer,
            layer_types=["sliding_attention" if w else "full_attention" for w in windows],
        )
    return hf


LLAMA_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def export_llama_hf(model: TransformerXLLM, out: str, context: int, model_type: str | None = None) -> str:
    """Write ``model`` in its family's transformers layout (``config.json`` + ``model.safetensors``, a tied head
    once, as ``save_pretrained`` writes it) into ``out``; ``model_type`` None: :func:`family_of`.  Returns the model
    type written."""
    from safetensors.torch import save_file

    from longseq.interop.transfo_xl import EXPORT_METADATA, check_export_directory

    if not isinstance(model, TransformerXLLM):
        raise ConversionError(f"only a language model exports to transformers; this is a {type(model).__name__}")
    model_type = model_type or family_of(model.config)
    config = hf_config_of(model.config, model_type, context)  # refused before anything is written
    check_export_directory(out, LLAMA_FILES)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_file(state_dict_to_hf(model), os.path.join(out, "model.safetensors"), metadata=EXPORT_METADATA)
    return model_type
