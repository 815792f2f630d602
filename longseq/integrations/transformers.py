"""longseq language models in transformers 5: ``import longseq.hf``, then ``AutoModelForCausalLM.from_pretrained``.

Importing this module registers :class:`LongseqConfig` (``model_type: "longseq"``) with ``AutoConfig`` and
:class:`LongseqForCausalLM` with ``AutoModelForCausalLM``, and makes :class:`LongseqCache` a pytree (so that
``torch.export`` takes and returns it); importing plain ``longseq`` never imports transformers.  Every longseq
language model loads (each attention pattern, mixer, memory policy, hourglass, adaptive softmax): the class holds a
:class:`~longseq.model.TransformerXLLM` (or the LSTM baseline) under ``.model`` and adds the transformers
conventions.

* ``forward(input_ids, cache=None, labels=None)`` reads ``input_ids`` as one segment after the memory in ``cache``
  (a :class:`LongseqCache`; ``None``: no memory), as ``TransformerXLLM.forward`` does.  ``labels`` follow
  transformers: ``labels`` is ``input_ids`` (or a copy with -100 where no loss is wanted) and the model shifts them,
  so position t is scored on ``labels[t + 1]``; longseq's own ``labels`` are already shifted.  The deprecated
  ``past_key_values`` is ``cache``, with transformers' deprecation warning.
* ``output_hidden_states``: the layers' input (the scaled embeddings) and every layer's output, (B, T, E) each (an
  hourglass's shortened block is one layer); ``output_attentions``: every attention layer's probabilities
  (B, H, T, K) over [memory; segment], recomputed from the layer's inputs by the readable reference
  (``RelativeMultiHeadAttention.probs``), whichever kernel ran.
* ``generate()`` samples as ``longseq generate`` does, with the same tokens for the same seed: the prompt but its
  last token is read in segments of ``config.segment_len`` into a key/value memory of ``config.generate_mem_len``
  positions (mixers keep their recurrent states in it), then one token at a time.  The cache is that memory.
  Beam search and assisted decoding are refused (the memory cannot be reordered or rolled back); an
  ``attention_mask`` with zeros (padding) is refused: a memory has no padding slots, so give unpadded rows.
* Embeddings: ``get_input_embeddings()`` is the ``nn.Embedding`` of the vocabulary (an ``AdaptiveEmbedding`` only
  with ``div_val`` > 1 and cutoffs); ``resize_token_embeddings`` resizes it and the softmax (no cutoffs);
  ``tie_word_embeddings`` is longseq's ``tie_weight``; ``gradient_checkpointing_enable()`` (and the Trainer's
  ``gradient_checkpointing``) is longseq's ``LayerStack.activation_checkpointing``.

Directories come from ``longseq convert --to-hf`` (:mod:`longseq.interop.hf_longseq` writes them without
transformers) or from ``save_pretrained``; both hold the same ``config.json`` and ``model.safetensors``, and the
tokenizer (``tokenizer.json``, which ``AutoTokenizer`` loads) when the model knows it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from contextlib import contextmanager
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
from torch import Tensor, nn
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.configuration_utils import PreTrainedConfig
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

from longseq.config import ModelConfig
from longseq.data.tokenizers import Tokenizer, load_tokenizer
from longseq.generation import read_prompt, recurrence_overrides, windowed
from longseq.interop.hf_longseq import (
    GENERATION_DEFAULTS,
    MODEL_TYPE,
    TOKENIZER_FILE,
    hf_config,
    save_tokenizers,
    tied_names,
)
from longseq.model import Memory, TransformerXLLM, build_model
from longseq.model.lstm import LSTMLM
from longseq.model.memory import CacheContext, HiddenMemory, KVMemory, RingContext, RingMemory
from longseq.model.stack import LayerStack
from longseq.model.transformer import IGNORE_INDEX

__all__ = ["LongseqCache", "LongseqConfig", "LongseqForCausalLM", "from_longseq"]

MIRRORED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
UNTIED_HEADS = {  # a softmax weight a tied checkpoint stores under the embedding's name -> that name
    re.compile(r"model\.crit\.out_layers\.(\d+)\.weight"): r"model.transformer.word_emb.emb_layers.\1.weight",
    re.compile(r"model\.decoder\.weight"): "model.embedding.weight",
}


@strict
class LongseqConfig(PreTrainedConfig):
    """A longseq :class:`~longseq.config.ModelConfig` (``longseq``, a dict; unknown keys are an error) and how
    ``generate`` reads a prompt: in segments of ``segment_len`` tokens (the training ``tgt_len``), with a memory of
    ``generate_mem_len`` positions (None: ``mem_len + segment_len``, as ``longseq generate``).  ``vocab_size``,
    ``hidden_size``, ``num_hidden_layers`` and ``num_attention_heads`` mirror it; ``tie_word_embeddings`` is its
    ``tie_weight`` (given, it sets it)."""

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
        given = dict(self.longseq or {})
        if self.tie_word_embeddings is not None:
            given["tie_weight"] = self.tie_word_embeddings
        model = ModelConfig.from_dict(given)  # ConfigError names an unknown or bad key
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
        self.tie_word_embeddings = model.tie_weight
        super().__post_init__(**kwargs)

    def model_config(self) -> ModelConfig:
        """The longseq model config, with ``tie_word_embeddings`` as its ``tie_weight`` (``from_pretrained(...,
        tie_word_embeddings=False)`` sets it after the config is read)."""
        return ModelConfig.from_dict({**self.longseq, "tie_weight": bool(self.tie_word_embeddings)})

    @property
    def sampling_mem_len(self) -> int:
        """The memory ``generate`` keeps: ``generate_mem_len``, else the model's ``mem_len + segment_len``."""
        mem_len = self.longseq["memory"]["mem_len"]
        return mem_len + self.segment_len if self.generate_mem_len is None else self.generate_mem_len


class LongseqCache:
    """``generate``'s cache: the recurrence :class:`~longseq.model.Memory` (XL memory, compressed memory, memory
    tokens, the mixers' recurrent states) and the recurrence settings it was made with.  A ring memory is written in
    place: continue from a cache once.

    ``seen`` counts the tokens read into it (generate's bookkeeping, on the host).  As a pytree (``torch.export``)
    the cache is its memory's tensors, with the memory's structure and the settings as context; ``seen`` is not
    carried (a cache rebuilt from its leaves has ``seen=None``, and generate refuses to continue from it)."""

    is_compileable = False
    is_croppable = False

    def __init__(self, memory: Memory | None, overrides: dict[str, Any] | None = None, seen: int | None = 0) -> None:
        self.memory = memory
        self.overrides = dict(overrides or {})
        self.seen = seen

    @property
    def is_linear(self) -> list[bool]:
        return [True]  # what it holds is not one entry per token: generate must not slice inputs by its length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen or 0

    def after(self, memory: Memory, tokens: int) -> LongseqCache:
        """The cache holding ``memory``, made by reading ``tokens`` more tokens into this one."""
        return LongseqCache(memory, self.overrides, None if self.seen is None else self.seen + tokens)


class LongseqForCausalLM(PreTrainedModel, GenerationMixin):
    """A longseq language model with the transformers interface (see the module docstring)."""

    config_class = LongseqConfig
    config: LongseqConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True  # no assisted decoding: the memory cannot be rolled back
    supports_gradient_checkpointing = True

    def __init__(self, config: LongseqConfig, tokenizer: Tokenizer | None = None) -> None:
        super().__init__(config)
        self.model = build_model(config.model_config())  # a TransformerXLLM (or the LSTM baseline), initialised
        config.longseq = self.model.config.to_dict()
        self.tokenizer = tokenizer  # longseq's tokenizer, written beside the weights by save_pretrained
        self._tied_weights_keys = {f"model.{t}": f"model.{s}" for t, s in tied_names(self.model).items()}
        self.post_init()
        if self.generation_config is not None:
            for key, value in GENERATION_DEFAULTS.items():  # longseq generate's defaults, not transformers' top_k=50
                if getattr(self.generation_config, key, None) is None:
                    setattr(self.generation_config, key, value)

    # -- loading and saving ---------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' ``from_pretrained``, refusing a checkpoint that lacks tensors of the model (transformers
        would warn and leave them uninitialised: longseq initialises only when it builds a model).  A softmax
        untied with ``tie_word_embeddings=False`` starts as a copy of the embedding a tied checkpoint stores; the
        directory's ``longseq_tokenizer.json``, if any, becomes ``model.tokenizer``."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = sorted(set(info["missing_keys"]) - model._untie_from_embeddings(info["missing_keys"]))
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} tensor(s) of the model: {', '.join(missing[:5])}")
        path = os.path.join(str(args[0] if args else kwargs.get("pretrained_model_name_or_path")), TOKENIZER_FILE)
        if os.path.isfile(path):
            model.tokenizer = load_tokenizer(path, vocab_size=model.config.vocab_size)
        return (model, info) if want_info else model

    def _untie_from_embeddings(self, missing) -> set[str]:
        """Copy each missing untied softmax weight from the embedding it was tied to; the names copied."""
        if self.config.tie_word_embeddings:
            return set()
        params, done = dict(self.named_parameters()), set()
        for name in missing:
            for pattern, source in UNTIED_HEADS.items():
                if pattern.fullmatch(name) and pattern.sub(source, name) in params:
                    with torch.no_grad():
                        params[name].copy_(params[pattern.sub(source, name)])
                    done.add(name)
        return done

    def save_pretrained(self, save_directory, *args, is_main_process: bool = True, **kwargs):
        """transformers' ``save_pretrained``, and with ``model.tokenizer`` set, the tokenizer files beside it
        (``longseq_tokenizer.json``, and ``tokenizer.json`` + ``tokenizer_config.json`` for ``AutoTokenizer``)."""
        super().save_pretrained(save_directory, *args, is_main_process=is_main_process, **kwargs)
        if self.tokenizer is not None and is_main_process:
            save_tokenizers(self.tokenizer, str(save_directory))

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is a LongseqCache, made in prepare_inputs_for_generation

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """The tensors longseq ties (``tie_weight``, ``tie_projs``), as the model was built."""
        return dict(self._tied_weights_keys)

    def _init_weights(self, module: torch.nn.Module) -> None:
        """longseq initialises every weight when the model is built (``TransformerXLLM.init_weights``); here only
        the buffers that are not saved are set again (u and v of a model without them are zeros)."""
        if isinstance(module, LayerStack):
            for name in ("r_w_bias", "r_r_bias"):
                buffer = module._buffers.get(name)
                if buffer is not None:
                    module._buffers[name] = torch.zeros_like(buffer)

    # -- embeddings -----------------------------------------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Module:
        """The vocabulary's ``nn.Embedding`` (``model.transformer.word_emb.emb_layers.0``; the LSTM's
        ``model.embedding``); with cutoffs and ``div_val`` > 1, the ``AdaptiveEmbedding`` of its clusters.  The
        backbone scales its output by sqrt(d_model) (and projects it with ``d_embed`` != ``d_model``)."""
        if isinstance(self.model, LSTMLM):
            return self.model.embedding
        embedding = self.model.transformer.word_emb
        return embedding.emb_layers[0] if len(embedding.emb_layers) == 1 else embedding

    def set_input_embeddings(self, value: nn.Module) -> None:
        if isinstance(self.model, LSTMLM):
            self.model.embedding = value
        elif len(self.model.transformer.word_emb.emb_layers) == 1 and isinstance(value, nn.Embedding):
            self.model.transformer.word_emb.emb_layers[0] = value
        else:
            raise ValueError("set_input_embeddings takes an nn.Embedding, for a model without adaptive clusters")

    def get_output_embeddings(self) -> nn.Linear | None:
        """The softmax's ``nn.Linear`` without cutoffs (``model.crit.out_layers.0``; the LSTM's ``model.decoder``);
        None for an adaptive softmax."""
        if isinstance(self.model, LSTMLM):
            return self.model.decoder
        crit = self.model.crit
        return crit.out_layers[0] if not crit.n_clusters else None

    def set_output_embeddings(self, value: nn.Linear) -> None:
        if isinstance(self.model, LSTMLM):
            self.model.decoder = value
        elif not self.model.crit.n_clusters:
            self.model.crit.out_layers[0] = value
        else:
            raise ValueError("an adaptive softmax has no single output embedding")

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing: bool = True):
        """transformers' ``resize_token_embeddings`` over the embedding and the softmax (rows kept, new rows at the
        old rows' mean, or with ``mean_resizing=False`` as longseq initialises them), the longseq config following.
        A model with cutoffs (an adaptive embedding and softmax) is refused."""
        if self.model.config.cutoffs:
            raise ValueError(
                f"resize_token_embeddings needs a plain embedding and softmax; this model's vocabulary is cut into "
                f"adaptive clusters at {self.model.config.cutoffs}"
            )
        old = self.config.vocab_size
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if embeddings.num_embeddings != old:
            self._resized(old, embeddings.num_embeddings, mean_resizing)
        return embeddings

    def _resized(self, old: int, new: int, mean_resizing: bool) -> None:
        """After transformers resized the weights (in place, through ``.data``): fresh parameters (a parameter
        that already ran a backward keeps its old shape in autograd), tied again; the softmax bias (a tied head's
        weight is resized with the embedding, its bias is not); longseq's initialisation of new rows without mean
        resizing; and the configs."""
        embedding, head, std = self.get_input_embeddings(), self.get_output_embeddings(), self.model.config.init_std
        tied = head.weight is embedding.weight
        embedding.weight = nn.Parameter(embedding.weight.data, requires_grad=embedding.weight.requires_grad)
        head.weight = embedding.weight if tied else nn.Parameter(head.weight.data, head.weight.requires_grad)
        with torch.no_grad():
            bias = head.bias.new_zeros(new)
            bias[: min(old, new)] = head.bias[: min(old, new)]
            head.bias = nn.Parameter(bias, requires_grad=head.bias.requires_grad)
            if new > old and not mean_resizing:  # transformers left nn.Embedding's N(0, 1) in the new rows
                for weight in {id(w): w for w in (embedding.weight, head.weight)}.values():
                    weight[old:].normal_(0.0, std)
                head.bias[old:] = 0
        config = dataclasses.replace(self.model.config, vocab_size=new)
        self.model.config = config
        if isinstance(self.model, TransformerXLLM):
            self.model.transformer.config = config
            self.model.transformer.word_emb.bounds = self.model.crit.bounds = [(0, new)]
            self.model.crit.vocab_size = self.model.crit.shortlist = new
        self.config.longseq = config.to_dict()

    # -- activation checkpointing ---------------------------------------------------------------------------------
    def _set_gradient_checkpointing(
        self, enable: bool = True, gradient_checkpointing_func=checkpoint, every_n_layers: int = 1
    ) -> None:
        """transformers' switch, set on longseq's own: ``LayerStack.activation_checkpointing`` = ``every_n_layers``
        (every that many layers recomputed in the backward pass, with ``torch.utils.checkpoint``, not reentrant)."""
        stacks = [m for m in self.model.modules() if isinstance(m, LayerStack)]
        if not stacks:
            raise ValueError(f"the {type(self.model).__name__} baseline has no activation checkpointing")
        if enable and not _is_plain_checkpoint(gradient_checkpointing_func):
            raise ValueError(
                "longseq recomputes layers with torch.utils.checkpoint.checkpoint(use_reentrant=False); other "
                f"activation checkpointing options (reentrant, offload) are not supported: {gradient_checkpointing_func}"
            )
        for stack in stacks:
            stack.activation_checkpointing = every_n_layers if enable else 0
        self.gradient_checkpointing = enable  # what is_activation_checkpointing reads

    # -- forward --------------------------------------------------------------------------------------------------
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: Tensor,  # (B, T)
        cache: LongseqCache | None = None,
        attention_mask: Tensor | None = None,  # (B, M + T) all ones
        labels: Tensor | None = None,  # (B, T), shifted inside
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits (B, T, V) (log-probabilities with an adaptive softmax; with ``logits_to_keep`` k > 0 the last k
        positions), the loss of ``labels`` shifted as transformers does (plus the compressors' reconstruction loss
        in training, as longseq trains), the new cache, and the hidden states and attentions asked for."""
        _refuse(kwargs, inputs_embeds)
        check_mask(attention_mask)
        hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        attentions = self.config.output_attentions if output_attentions is None else output_attentions
        memory, overrides = (cache.memory, cache.overrides) if cache is not None else (None, {})
        layers = self._recorder(hidden_states, attentions)
        with attention_inputs(self.model, attentions) as captured:
            out = self.model(input_ids, memory, **layers, **overrides)  # LMOutput: logits (B, T, V), the new memory
        loss = None if labels is None else causal_lm_loss(out.logits, labels, num_items_in_batch)
        if loss is not None and out.aux_loss is not None:
            loss = loss + out.aux_loss
        logits = out.logits if logits_to_keep == 0 else out.logits[:, -logits_to_keep:]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        new_cache = (cache or LongseqCache(None, overrides)).after(out.mems, input_ids.size(1)) if use_cache else None
        segment = self._segment_rows(input_ids.size(1))
        result = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=new_cache,
            hidden_states=None if not layers else tuple(h[:, segment] for h in layers["layer_outputs"]),
            attentions=None if captured is None else tuple(module.probs(*a)[:, :, segment] for module, a in captured),
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return result if return_dict else result.to_tuple()

    def _recorder(self, hidden_states: bool, attentions: bool) -> dict:
        """The model's ``layer_outputs`` list when hidden states are asked for; the LSTM baseline has neither."""
        if isinstance(self.model, LSTMLM) and (hidden_states or attentions):
            raise ValueError(
                "the LSTM baseline returns no hidden states or attentions (torch's nn.LSTM gives its top layer only)"
            )
        return {"layer_outputs": []} if hidden_states else {}

    def _segment_rows(self, qlen: int) -> slice:
        """The segment's positions among those the layers see: memory tokens wrap it, n before and n after."""
        tokens = self.model.config.memory.mem_tokens
        return slice(tokens, tokens + qlen)

    # -- generation -----------------------------------------------------------------------------------------------
    def _prepare_attention_mask_for_generation(self, inputs_tensor, generation_config, model_kwargs) -> Tensor:
        """transformers' mask (``input_ids != pad_token_id`` when the prompt holds that token), refused by name
        when it masks anything: longseq reads no padding."""
        mask = super()._prepare_attention_mask_for_generation(inputs_tensor, generation_config, model_kwargs)
        if not bool((mask == 1).all()):
            row, position = (int(i) for i in (mask != 1).nonzero()[0])
            pad = generation_config.pad_token_id
            raise ValueError(
                f"generate() made attention_mask = input_ids != pad_token_id ({pad}), and input_ids[{row}, "
                f"{position}] is that token: longseq models read no padding (the recurrence memory has no padding "
                "slots). If the token is text (pad_token_id = eos_token_id is common), pass "
                "attention_mask=torch.ones_like(input_ids); if it is padding, generate each row unpadded"
            )
        return mask

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
        cache) are read in segments of ``segment_len`` into its memory; then the last token is fed alone (its
        hidden states and attentions are the step's).  A model without a memory (absolute positions) reads its last
        ``segment_len`` tokens again every step."""
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
        if cache.seen is None:
            raise ValueError(
                "this cache was rebuilt from its tensors (torch.export, a pytree) and does not know how many tokens "
                "it has read: continue generate() from a cache that forward or generate returned"
            )
        if input_ids.size(1) <= cache.seen:
            raise ValueError(
                f"the cache has read {cache.seen} tokens and input_ids has {input_ids.size(1)}: give the tokens it read "
                "and at least one more (generate feeds the last one and reads the others it has not read)"
            )
        if cache.memory is None or input_ids.size(1) - 1 > cache.seen:  # read what the cache has not (maybe nothing)
            unread = input_ids[:, cache.seen : -1]
            memory = cache.memory if cache.memory is not None else self._empty_memory()
            memory = read_prompt(self.model, unread, self.config.segment_len, cache.overrides, memory)
            cache = LongseqCache(memory, cache.overrides, input_ids.size(1) - 1)
        return {**inputs, "input_ids": input_ids[:, -1:], "cache": cache, **kwargs}

    def _empty_memory(self) -> Memory:
        """The memory generate starts from: ``longseq generate``'s (keys and values in ring buffers, written in
        place; hidden states for a compacted memory), or, when ``forward`` is compiled (``model.forward =
        torch.compile(model.forward)``), keys and values concatenated anew each step: torch.compile's dynamic shapes
        cannot follow a ring's host-side indices (inductor fails with ``name 's0' is not defined``), and the
        concatenated memory reaches one shape once full.  Both give the same tokens."""
        if self.model.config.memory.compacted:
            return Memory.empty(HiddenMemory)
        compiled = getattr(self.forward, "_torchdynamo_orig_callable", None) is not None  # torch.compile's wrapper
        return Memory.empty(KVMemory if compiled else RingMemory)


@contextmanager
def attention_inputs(model: TransformerXLLM, wanted: bool):
    """With ``wanted``, a list that fills, as ``model`` runs, with (attention module, its inputs) for every
    attention layer, in order: what ``RelativeMultiHeadAttention.probs`` recomputes the probabilities from.  A ring
    key/value cache (written in place by the layer) is read as the keys and values it held before the layer ran."""
    if not wanted:
        yield None
        return
    captured: list[tuple[nn.Module, tuple]] = []

    def hook(module, args):
        args = list(args)  # (hidden, rel_key, r_w_bias, r_r_bias, mask, context)
        context = args[5] if len(args) > 5 else None
        if isinstance(context, RingContext):
            ring = context.ring
            held = (ring.keys.view(ring.length).clone(), ring.values.view(ring.length).clone()) if ring.length else ()
            args[5] = CacheContext(*held)
        captured.append((module, tuple(args[:6])))

    layers = [layer for layer in model.transformer.layers if layer.attends]
    handles = [layer.dec_attn.register_forward_pre_hook(hook) for layer in layers]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _is_plain_checkpoint(func) -> bool:
    """Whether ``func`` is ``torch.utils.checkpoint.checkpoint`` without options but ``use_reentrant=False``."""
    if func is checkpoint:
        return True
    return (
        isinstance(func, functools.partial)
        and func.func is checkpoint
        and not func.args
        and func.keywords in ({}, {"use_reentrant": False})
    )


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
        row, position = (int(i) for i in (attention_mask != 1).nonzero()[0])
        raise ValueError(
            f"attention_mask has zeros (padding), the first at [{row}, {position}]: longseq models read unpadded "
            "rows only (the recurrence memory has no padding slots); batch prompts of one length, or generate each "
            "row on its own"
        )


def _refuse(kwargs: dict, inputs_embeds: Tensor | None) -> None:
    if inputs_embeds is not None:
        raise ValueError("LongseqForCausalLM reads input_ids, not inputs_embeds (the embedding is adaptive and scaled)")
    unused = {k: v for k, v in kwargs.items() if v is not None and v is not False}
    if unused:
        raise TypeError(f"LongseqForCausalLM.forward does not take {sorted(unused)}")


def from_longseq(
    model: TransformerXLLM,
    segment_len: int = 128,
    generate_mem_len: int | None = None,
    tokenizer: Tokenizer | None = None,
):
    """A :class:`LongseqForCausalLM` holding ``model``'s weights (copied), ready for ``save_pretrained`` (which
    writes ``tokenizer``'s files too, when given)."""
    config = LongseqConfig(longseq=model.config.to_dict(), segment_len=segment_len, generate_mem_len=generate_mem_len)
    hf = LongseqForCausalLM(config, tokenizer)
    hf.model.load_state_dict(model.state_dict())
    return hf.to(next(model.parameters()).dtype).eval()


# -- LongseqCache as a pytree: the memory's tensors are the leaves, its structure (with a marker where each tensor
# was) and the recurrence settings the context.  the memory and its layer states are frozen dataclasses.
class _Leaf:
    """Where a tensor was in the memory's structure."""

    def __repr__(self) -> str:
        return "<tensor>"


LEAF = _Leaf()


def _skeleton(value, leaves: list):
    if isinstance(value, Tensor):
        leaves.append(value)
        return LEAF
    if value is None or isinstance(value, (bool, int, float, str, type)):  # a type: the memory's kind
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_skeleton(v, leaves) for v in value)
    if isinstance(value, RingMemory):
        raise ValueError(
            "a ring memory (generate's: written in place) cannot be flattened for torch.export; export a step over "
            "a cache that forward returned (hidden-state memory)"
        )
    if dataclasses.is_dataclass(value):
        fields = {f.name: _skeleton(getattr(value, f.name), leaves) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    raise ValueError(f"a {type(value).__name__} in the cache's memory cannot be flattened")


def _fill(value, leaves):
    if value is LEAF:
        return next(leaves)
    if isinstance(value, (tuple, list)):
        return type(value)(_fill(v, leaves) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value, **{f.name: _fill(getattr(value, f.name), leaves) for f in dataclasses.fields(value) if f.init}
        )
    return value


def _flatten_cache(cache: LongseqCache) -> tuple[list[Tensor], tuple]:
    leaves: list[Tensor] = []
    skeleton = _skeleton(cache.memory, leaves)
    return leaves, (skeleton, tuple(sorted(cache.overrides.items())))


def _unflatten_cache(leaves, context: tuple) -> LongseqCache:
    skeleton, overrides = context
    return LongseqCache(_fill(skeleton, iter(leaves)), dict(overrides), seen=None)


def _flatten_cache_with_keys(cache: LongseqCache):
    leaves, context = _flatten_cache(cache)
    return [(pytree.SequenceKey(i), leaf) for i, leaf in enumerate(leaves)], context


pytree.register_pytree_node(
    LongseqCache,
    _flatten_cache,
    _unflatten_cache,
    serialized_type_name="longseq.integrations.transformers.LongseqCache",
    flatten_with_keys_fn=_flatten_cache_with_keys,
)
AutoConfig.register(MODEL_TYPE, LongseqConfig)
AutoModelForCausalLM.register(LongseqConfig, LongseqForCausalLM)
