"""longseq language models in transformers 5: ``import longseq.hf``, then ``AutoModelForCausalLM.from_pretrained``.

Importing this module registers :class:`LongseqConfig` (``model_type: "longseq"``) with ``AutoConfig`` and
:class:`LongseqForCausalLM` with ``AutoModelForCausalLM``; importing plain ``longseq`` never imports transformers.
Every longseq language model loads (each attention pattern, mixer, memory policy, hourglass, adaptive softmax): the
class holds a :class:`~longseq.model.TransformerXLLM` (or the LSTM baseline) under ``.model`` and adds the
transformers conventions.

* ``forward(input_ids, cache=None, labels=None)`` reads ``input_ids`` as one segment after the memory in ``cache``
  (a :class:`LongseqCache`; ``None``: no memory), as ``TransformerXLLM.forward`` does.  ``labels`` follow
  transformers: ``labels`` is ``input_ids`` (or a copy with -100 where no loss is wanted) and the model shifts them,
  so position t is scored on ``labels[t + 1]``; longseq's own ``labels`` are already shifted.
* ``generate()`` samples as ``longseq generate`` does, with the same tokens for the same seed: the prompt but its
  last token is read in segments of ``config.segment_len`` into a key/value memory of ``config.generate_mem_len``
  positions (mixers keep their recurrent states in it), then one token at a time.  The cache is that memory.
  Beam search and assisted decoding are refused (the memory cannot be reordered or rolled back); an
  ``attention_mask`` with zeros (padding) is refused: a memory has no padding slots, so give unpadded rows.

Directories come from ``longseq convert --to-hf`` (:mod:`longseq.interop.hf_longseq` writes them without
transformers) or from ``save_pretrained``; both hold the same ``config.json`` and ``model.safetensors``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

try:
    import transformers
except ImportError:
    raise ImportError('longseq.hf needs transformers 5: pip install "longseq[hf]"') from None
if int(transformers.__version__.split(".")[0]) < 5:
    raise ImportError(
        f'longseq.hf needs transformers 5, this is {transformers.__version__}: pip install "longseq[hf]" (with '
        "transformers 4.x, export with longseq convert --to-hf --format transfo-xl; see docs/transformers.md)"
    )

from huggingface_hub.dataclasses import strict
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.configuration_utils import PreTrainedConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

from longseq.config import ModelConfig
from longseq.generation import read_prompt, recurrence_overrides, windowed
from longseq.interop.hf_longseq import GENERATION_DEFAULTS, MODEL_TYPE, hf_config, tied_names
from longseq.interop.transfo_xl import refuse_non_finite
from longseq.model import Memory, TransformerXLLM, build_model
from longseq.model.lstm import LSTMLM
from longseq.model.stack import LayerStack
from longseq.model.transformer import IGNORE_INDEX

__all__ = ["LongseqCache", "LongseqConfig", "LongseqForCausalLM", "from_longseq"]

MIRRORED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "tie_word_embeddings")


@strict
class LongseqConfig(PreTrainedConfig):
    """A longseq :class:`~longseq.config.ModelConfig` (``longseq``, a dict; unknown keys are an error) and how
    ``generate`` reads a prompt: in segments of ``segment_len`` tokens (the training ``tgt_len``), with a memory of
    ``generate_mem_len`` positions (None: ``mem_len + segment_len``, as ``longseq generate``).  ``vocab_size``,
    ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads`` and ``tie_word_embeddings`` mirror it."""

    model_type = MODEL_TYPE
    longseq: dict | None = None
    segment_len: int = 128
    generate_mem_len: int | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    tie_word_embeddings: bool | None = None
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        model = ModelConfig.from_dict(self.longseq or {})  # ConfigError names an unknown or bad key
        self.longseq = model.to_dict()
        if self.segment_len < 1:
            raise ValueError(f"segment_len must be >= 1, got {self.segment_len}")
        if self.generate_mem_len is not None and self.generate_mem_len < 0:
            raise ValueError(f"generate_mem_len must be >= 0 or None, got {self.generate_mem_len}")
        mirrored = hf_config(model)
        for key in MIRRORED:
            value = mirrored[key]
            given = getattr(self, key)
            if given is not None and given != value:
                raise ValueError(f"config {key}={given} disagrees with the longseq model config, which has {value}")
            setattr(self, key, value)
        super().__post_init__(**kwargs)

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.longseq)

    @property
    def sampling_mem_len(self) -> int:
        """The memory ``generate`` keeps: ``generate_mem_len``, else the model's ``mem_len + segment_len``."""
        mem_len = self.longseq["memory"]["mem_len"]
        return mem_len + self.segment_len if self.generate_mem_len is None else self.generate_mem_len


class LongseqCache:
    """``generate``'s cache: the recurrence :class:`~longseq.model.Memory` (XL memory, compressed memory, memory
    tokens, the mixers' recurrent states) and the recurrence settings it was made with.  A ring memory is written in
    place: continue from a cache once."""

    is_compileable = False
    is_croppable = False

    def __init__(self, memory: Memory | None, overrides: dict[str, Any] | None = None, seen: int = 0) -> None:
        self.memory = memory
        self.overrides = dict(overrides or {})
        self.seen = seen  # tokens read into it

    @property
    def is_linear(self) -> list[bool]:
        return [True]  # what it holds is not one entry per token: generate must not slice inputs by its length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen


class LongseqForCausalLM(PreTrainedModel, GenerationMixin):
    """A longseq language model with the transformers interface (see the module docstring)."""

    config_class = LongseqConfig
    config: LongseqConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True  # no assisted decoding: the memory cannot be rolled back
    supports_gradient_checkpointing = False

    def __init__(self, config: LongseqConfig) -> None:
        super().__init__(config)
        self.model = build_model(config.model_config())  # a TransformerXLLM (or the LSTM baseline), initialised
        self._tied_weights_keys = {f"model.{t}": f"model.{s}" for t, s in tied_names(self.model).items()}
        self.post_init()
        if self.generation_config is not None:
            for key, value in GENERATION_DEFAULTS.items():  # longseq generate's defaults, not transformers' top_k=50
                if getattr(self.generation_config, key, None) is None:
                    setattr(self.generation_config, key, value)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' ``from_pretrained``, refusing a checkpoint that lacks tensors of the model (transformers
        would warn and leave them uninitialised: longseq initialises only when it builds a model) or whose weights
        hold NaN or Inf (the model would score NaN and generate token 0 forever; longseq's own loader refuses them
        too)."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        if info["missing_keys"]:
            missing = sorted(info["missing_keys"])
            raise ValueError(f"the checkpoint lacks {len(missing)} tensor(s) of the model: {', '.join(missing[:5])}")
        refuse_non_finite(model.model, str(args[0]) if args else "the checkpoint")
        return (model, info) if want_info else model

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is a LongseqCache, made in prepare_inputs_for_generation

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """The tensors longseq ties (``tie_weight``, ``tie_projs``), whatever ``tie_word_embeddings`` says."""
        return dict(self._tied_weights_keys)

    def _init_weights(self, module: torch.nn.Module) -> None:
        """longseq initialises every weight when the model is built (``TransformerXLLM.init_weights``); here only
        the buffers that are not saved are set again (u and v of a model without them are zeros)."""
        if isinstance(module, LayerStack):
            for name in ("r_w_bias", "r_r_bias"):
                buffer = module._buffers.get(name)
                if buffer is not None:
                    module._buffers[name] = torch.zeros_like(buffer)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embedding if isinstance(self.model, LSTMLM) else self.model.transformer.word_emb

    def get_output_embeddings(self) -> None:
        return None  # an adaptive softmax, not one Linear: resize_token_embeddings is not supported

    def forward(
        self,
        input_ids: Tensor,  # (B, T)
        cache: LongseqCache | None = None,
        attention_mask: Tensor | None = None,  # (B, M + T) all ones
        labels: Tensor | None = None,  # (B, T), shifted inside
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits (B, T, V) (log-probabilities with an adaptive softmax; with ``logits_to_keep`` k > 0 the last k
        positions), the loss of ``labels`` shifted as transformers does (plus the compressors' reconstruction loss
        in training, as longseq trains), and the new cache."""
        _refuse(kwargs)
        check_mask(attention_mask)
        memory, overrides = (cache.memory, cache.overrides) if cache is not None else (None, {})
        out = self.model(input_ids, memory, **overrides)  # LMOutput: logits (B, T, V), the new memory
        loss = None if labels is None else causal_lm_loss(out.logits, labels, num_items_in_batch)
        if loss is not None and out.aux_loss is not None:
            loss = loss + out.aux_loss
        logits = out.logits if logits_to_keep == 0 else out.logits[:, -logits_to_keep:]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        seen = (cache.seen if cache is not None else 0) + input_ids.size(1)
        new_cache = LongseqCache(out.mems, overrides, seen) if use_cache else None
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if not return_dict:
            return tuple(x for x in (loss, logits, new_cache) if x is not None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=new_cache)

    def prepare_inputs_for_generation(
        self,
        input_ids: Tensor,  # (B, L): the prompt and the tokens drawn so far
        cache: LongseqCache | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        use_cache: bool | None = True,
        logits_to_keep: int | None = None,
        **kwargs,
    ) -> dict:
        """As ``longseq generate``: the tokens but the last that the cache has not read (all of them without a
        cache) are read in segments of ``segment_len`` into its memory; then the last token is fed alone.  A model without a memory (absolute
        positions) reads its last ``segment_len`` tokens again every step."""
        if inputs_embeds is not None:
            raise ValueError("LongseqForCausalLM generates from input_ids, not inputs_embeds")
        check_mask(attention_mask)
        kwargs.pop("next_sequence_length", None)
        kwargs.pop("is_first_iteration", None)
        inputs = {"use_cache": use_cache, **({"logits_to_keep": logits_to_keep} if logits_to_keep else {})}
        if windowed(self.model):
            window = input_ids[:, -self.config.segment_len :]
            return {**inputs, "input_ids": window, "cache": LongseqCache(None, {"mem_len": 0}), **kwargs}
        if cache is None:
            cache = LongseqCache(None, recurrence_overrides(self.model, self.config.sampling_mem_len))
        if input_ids.size(1) <= cache.seen:
            raise ValueError(
                f"the cache has read {cache.seen} tokens and input_ids has {input_ids.size(1)}: give the tokens it read "
                "and at least one more (generate feeds the last one and reads the others it has not read)"
            )
        if cache.memory is None or input_ids.size(1) - 1 > cache.seen:  # read what the cache has not (maybe nothing)
            unread = input_ids[:, cache.seen : -1]
            memory = read_prompt(self.model, unread, self.config.segment_len, cache.overrides, cache.memory)
            cache = LongseqCache(memory, cache.overrides, input_ids.size(1) - 1)
        return {**inputs, "input_ids": input_ids[:, -1:], "cache": cache, **kwargs}


def causal_lm_loss(scores: Tensor, labels: Tensor, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """transformers' causal-LM loss: position t is scored on ``labels[:, t + 1]`` (-100 ignored), the mean over
    the scored tokens (or the sum over ``num_items_in_batch``, as the Trainer asks with gradient accumulation).
    ``scores`` (B, T, V) may be logits or log-probabilities (log_softmax leaves those as they are)."""
    if labels.shape != scores.shape[:2]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape {tuple(scores.shape[:2])}")
    flat = scores[:, :-1].reshape(-1, scores.size(-1)).float()  # (B (T - 1), V)
    target = labels[:, 1:].reshape(-1).long().to(scores.device)
    if num_items_in_batch is None:
        return F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX)
    return F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX, reduction="sum") / num_items_in_batch


def check_mask(attention_mask: Tensor | None) -> None:
    """Refuse padding: a memory has no empty slots, so rows of different lengths cannot share a batch."""
    if attention_mask is not None and not bool((attention_mask == 1).all()):
        raise ValueError(
            "attention_mask has zeros (padding): longseq models read unpadded rows only (the recurrence memory has "
            "no padding slots); batch prompts of one length, or generate each row on its own"
        )


def _refuse(kwargs: dict) -> None:
    unused = {k: v for k, v in kwargs.items() if v is not None and v is not False}
    if unused:
        raise TypeError(f"LongseqForCausalLM.forward does not take {sorted(unused)}")


def from_longseq(model: TransformerXLLM, segment_len: int = 128, generate_mem_len: int | None = None):
    """A :class:`LongseqForCausalLM` holding ``model``'s weights (copied), ready for ``save_pretrained``."""
    config = LongseqConfig(longseq=model.config.to_dict(), segment_len=segment_len, generate_mem_len=generate_mem_len)
    hf = LongseqForCausalLM(config)
    hf.model.load_state_dict(model.state_dict())
    return hf.to(next(model.parameters()).dtype).eval()


AutoConfig.register(MODEL_TYPE, LongseqConfig)
AutoModelForCausalLM.register(LongseqConfig, LongseqForCausalLM)
