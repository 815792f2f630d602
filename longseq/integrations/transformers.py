"""longseq language models in transformers 5: ``import longseq.hf``, then ``AutoModelForCausalLM.from_pretrained``.

Importing this module registers :class:`LongseqConfig` (``model_type: "longseq"``) with ``AutoConfig`` and
:class:`LongseqForCausalLM` with ``AutoModelForCausalLM`` (:class:`LongseqCache` is a pytree, so that
``torch.export`` takes and returns it); importing plain ``longseq`` never imports transformers.  Every longseq
language model loads (each attention pattern, mixer, memory policy, hourglass, adaptive softmax): the class holds a
:class:`~longseq.model.TransformerXLLM` (or the LSTM baseline) under ``.model`` and adds the transformers
conventions.

* ``forward(input_ids, cache=None, labels=None)`` reads ``input_ids`` as one segment after the memory in ``cache``
  (a :class:`LongseqCache`; ``None``: no memory), as ``TransformerXLLM.forward`` does.  ``labels`` follow
  transformers: ``labels`` is ``input_ids`` (or a copy with -100 where no loss is wanted) and the model shifts them,
  so position t is scored on ``labels[t + 1]``; longseq's own ``labels`` are already shifted.  The deprecated
  ``past_key_values`` is ``cache``, with transformers' deprecation warning.  An empty transformers cache
  (``DynamicCache()``), tuple or list is no memory; any other cache than a :class:`LongseqCache` is refused by name.
* ``output_hidden_states``: the layers' input (the scaled embeddings) and every layer's output, (B, T, E) each (an
  hourglass's shortened block is one layer; with ``final_norm`` the last after the final norm);
  ``output_attentions``: every attention layer's probabilities (B, H, T, K) over [memory; segment], recomputed from
  the layer's inputs by the readable reference (``RelativeMultiHeadAttention.probs``), whichever kernel ran.
* ``generate()`` samples as ``longseq generate`` does, with the same tokens for the same seed: the prompt but its
  last token is read in segments of ``config.segment_len`` into a key/value memory of ``config.generate_mem_len``
  positions (mixers keep their recurrent states in it), then one token at a time.  The cache is that memory
  (:mod:`longseq.integrations.longseq_cache`); beam search reorders its rows.  Assisted decoding is refused (the
  memory cannot be rolled back).
* Padding (``attention_mask`` 0, left padding as transformers pads for generation, or anywhere; or the
  tokenizer's padding id, which lies outside the vocabulary) is skipped: each row reads only its own tokens, its
  positions and memory as if it were alone, so a padded batch gives every row its own logits and tokens.  Rows
  that have read different numbers of tokens keep separate memories and run as separate batches until their
  memories come to one length.
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
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors import safe_open

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
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM, Cache, GenerationMixin, PreTrainedModel
from transformers.configuration_utils import PreTrainedConfig
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

from longseq.config import ConfigError, ModelConfig, Recurrence
from longseq.config.stored import RENAMES, has_old_names, stored_model
from longseq.data.tokenizers import Tokenizer, load_tokenizer
from longseq.generation import read_prompt, windowed
from longseq.integrations.longseq_cache import LongseqCache, RowGroup, merged, row_groups
from longseq.interop.hf_longseq import (
    GENERATION_DEFAULTS,
    LOAD_NOTE,
    MODEL_TYPE,
    TOKENIZER_FILE,
    hf_config,
    model_card,
    sampling_settings,
    save_tokenizers,
    tied_names,
)
from longseq.interop.hf_tokenizer import ends_every_text
from longseq.interop.transfo_xl import float_weights, refuse_cast_weights, refuse_non_finite, stored_dtypes
from longseq.model import Memory, TransformerXLLM, build_model
from longseq.model.lstm import LSTMLM
from longseq.model.memory import CacheContext, HiddenMemory, KVMemory, RingContext, RingMemory
from longseq.model.registry import MODEL_SPECS
from longseq.model.stack import LayerStack
from longseq.model.transformer import IGNORE_INDEX

__all__ = ["LongseqCache", "LongseqConfig", "LongseqForCausalLM", "from_longseq"]

MIRRORED = {  # the transformers names of config.json, and the longseq section's fields they mirror
    "vocab_size": "longseq.vocab_size",
    "hidden_size": "longseq.d_model",
    "num_hidden_layers": "longseq.n_layer",
    "num_attention_heads": "longseq.n_head",
}
UNTIED_HEADS = {  # a softmax weight a tied checkpoint stores under the embedding's name -> that name (ModelSpec's)
    re.compile(r"model\." + pattern): f"model.{name}"
    for spec in MODEL_SPECS.values()
    for pattern, name in spec.tied_heads.items()
}


def config_source(name_or_path: str | None) -> str:
    """The ``config.json`` a LongseqConfig is read from (transformers passes the directory as ``name_or_path``)."""
    if not name_or_path:
        return "the LongseqConfig (config.json)"
    return os.path.join(name_or_path, "config.json") if os.path.isdir(name_or_path) else f"{name_or_path}'s config.json"


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
    longseq_run: dict | None = None  # the training run's data and train sections: kept for convert --from-hf
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    tie_word_embeddings: bool | None = None
    use_cache: bool = True
    longseq_load: str = LOAD_NOTE  # what to import (for a reader of config.json without longseq)

    def __post_init__(self, **kwargs):
        source = config_source(kwargs.get("name_or_path"))  # the file an error names: the one to fix
        given = stored_model(dict(self.longseq or {}))  # as it was saved, if before a field existed
        if self.tie_word_embeddings is not None:
            given["tie_weight"] = self.tie_word_embeddings
        try:
            model = ModelConfig.from_dict(given)  # ConfigError names an unknown or bad key
        except ConfigError as exc:
            raise ConfigError(f"{source}, its longseq section: {exc}") from None
        self.longseq = model.to_dict()
        sampling_settings({"segment_len": self.segment_len, "generate_mem_len": self.generate_mem_len}, source)
        mirrored = hf_config(model)
        for key, field_name in MIRRORED.items():
            value = mirrored[key]
            given = getattr(self, key)
            if given is not None and given != value:
                raise ValueError(
                    f"{source}: {key}={given} disagrees with its longseq section, which has {field_name}={value} (the "
                    f"shape of the weights): fix {key} in {source}, or remove it (it mirrors the longseq section)"
                )
            setattr(self, key, value)
        self.tie_word_embeddings = model.tie_weight
        super().__post_init__(**kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """transformers' ``from_pretrained``, which names the directory read to the checks (``AutoConfig`` does)."""
        kwargs.setdefault("name_or_path", str(pretrained_model_name_or_path))
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    def model_config(self) -> ModelConfig:
        """The longseq model config, with ``tie_word_embeddings`` as its ``tie_weight`` (``from_pretrained(...,
        tie_word_embeddings=False)`` sets it after the config is read)."""
        return ModelConfig.from_dict({**self.longseq, "tie_weight": bool(self.tie_word_embeddings)})

    @property
    def sampling_mem_len(self) -> int:
        """The memory ``generate`` keeps: ``generate_mem_len``, else the model's ``mem_len + segment_len``."""
        mem_len = self.longseq["memory"]["mem_len"]
        return mem_len + self.segment_len if self.generate_mem_len is None else self.generate_mem_len


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
            defaults = {**GENERATION_DEFAULTS, "pad_token_id": config.vocab_size}  # the padding id (see _kept)
            for key, value in defaults.items():  # longseq generate's defaults, not transformers' top_k=50
                if getattr(self.generation_config, key, None) is None:
                    setattr(self.generation_config, key, value)

    # -- loading and saving ---------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' ``from_pretrained``, refusing a checkpoint that lacks tensors of the model (transformers
        would warn and leave them uninitialised: longseq initialises only when it builds a model) or whose weights
        hold NaN or Inf (the model would score NaN and generate token 0 forever; longseq's own loader refuses them
        too).  A local export written before a rename of longseq's weights loads under today's names (the renames
        of :data:`longseq.config.stored.RENAMES`, as transformers' ``key_mapping``).  A softmax untied with ``tie_word_embeddings=False`` starts as a copy of the embedding a tied
        checkpoint stores; the directory's ``longseq_tokenizer.json``, if any, becomes ``model.tokenizer``."""
        want_info = kwargs.pop("output_loading_info", False)
        directory = str(args[0] if args else kwargs.get("pretrained_model_name_or_path"))
        renamed = "key_mapping" not in kwargs and _has_old_names(directory)
        if renamed:
            kwargs["key_mapping"] = dict(RENAMES)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        if renamed:
            model._weight_conversions = None  # transformers' record of the renaming: save_pretrained writes today's
        missing = sorted(set(info["missing_keys"]) - model._untie_from_embeddings(info["missing_keys"]))
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} tensor(s) of the model: {', '.join(missing[:5])}")
        weights = os.path.join(directory, "model.safetensors")
        if os.path.isfile(weights):  # a local export: its integer tensors were cast into float weights
            refuse_cast_weights(stored_dtypes(weights), weights, float_weights(model))
        refuse_non_finite(model.model, str(args[0]) if args else "the checkpoint")
        path = os.path.join(directory, TOKENIZER_FILE)
        if os.path.isfile(path):
            model.tokenizer = load_tokenizer(path, vocab_size=model.config.vocab_size)
        if ends_every_text(directory):
            warnings.warn(
                f"{directory}/tokenizer.json ends every text with <eos> (a word tokenizer exported before 2026-12-07): "
                "a prompt ends its line and an evaluation request scores one <eos> more than its text; export the "
                "checkpoint again (longseq convert --to-hf)",
                stacklevel=2,
            )
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
        """transformers' ``save_pretrained``, a ``README.md`` model card that says what to import (unless the
        directory has one), and with ``model.tokenizer`` set, the tokenizer files beside it
        (``longseq_tokenizer.json``, and ``tokenizer.json`` + ``tokenizer_config.json`` for ``AutoTokenizer``)."""
        super().save_pretrained(save_directory, *args, is_main_process=is_main_process, **kwargs)
        card = os.path.join(str(save_directory), "README.md")
        if is_main_process and not os.path.exists(card):  # what to import; a card of the user's own is kept
            with open(card, "w", encoding="utf-8") as f:
                f.write(model_card(self.model.config))
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
        """``value`` (an ``nn.Embedding`` of the vocabulary's rows and the embedding's width) in place of the
        vocabulary's embedding; a tied softmax (``tie_word_embeddings``) follows it: its weight is ``value``'s."""
        current = self.get_input_embeddings()
        if not isinstance(value, nn.Embedding) or not isinstance(current, nn.Embedding):
            raise ValueError("set_input_embeddings takes an nn.Embedding, for a model without adaptive clusters")
        if value.weight.shape != current.weight.shape:
            raise ValueError(
                f"set_input_embeddings: the embedding has {tuple(value.weight.shape)} rows x width, the model "
                f"{tuple(current.weight.shape)}: resize_token_embeddings changes the vocabulary"
            )
        head = self.get_output_embeddings()
        tied = head is not None and head.weight is current.weight
        if isinstance(self.model, LSTMLM):
            self.model.embedding = value
        else:
            self.model.transformer.word_emb.emb_layers[0] = value
        if tied:
            head.weight = value.weight

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
            if head.bias is not None:  # none with head_bias=false (an imported Llama-family model)
                bias = head.bias.new_zeros(new)
                bias[: min(old, new)] = head.bias[: min(old, new)]
                head.bias = nn.Parameter(bias, requires_grad=head.bias.requires_grad)
            if new > old and not mean_resizing:  # transformers left nn.Embedding's N(0, 1) in the new rows
                for weight in {id(w): w for w in (embedding.weight, head.weight)}.values():
                    weight[old:].normal_(0.0, std)
                if head.bias is not None:
                    head.bias[old:] = 0
        config = dataclasses.replace(self.model.config, vocab_size=new)
        self.model.config = config
        if isinstance(self.model, TransformerXLLM):
            self.model.transformer.stack.config = config
            self.model.transformer.word_emb.bounds = self.model.crit.bounds = [(0, new)]
            self.model.crit.vocab_size = self.model.crit.shortlist = new
        self.config.longseq = config.to_dict()
        if self.generation_config is not None and self.generation_config.pad_token_id == old:
            self.generation_config.pad_token_id = new  # the padding id is the first after the vocabulary

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
        attention_mask: Tensor | None = None,  # (B, T) or (B, seen + T): 0 where padding
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
        in training, as longseq trains), the new cache, and the hidden states and attentions asked for.  Padding
        (``attention_mask`` 0, or the tokenizer's padding id) is skipped: each row reads its own tokens, and the
        outputs at padded positions are zeros."""
        _refuse(kwargs, inputs_embeds)
        hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        attentions = self.config.output_attentions if output_attentions is None else output_attentions
        cache = longseq_cache(cache) or LongseqCache()
        keep = self._kept(input_ids, attention_mask)
        if keep is None and cache.whole:
            read = self._read(input_ids, cache.groups[0].memory, cache.recurrence, hidden_states, attentions)
            loss = None if labels is None else causal_lm_loss(read.logits, labels, num_items_in_batch)
            groups = (RowGroup(None, read.memory),)
        else:
            read, scored, groups = self._read_rows(input_ids, keep, cache, labels, hidden_states, attentions)
            loss = None if labels is None else reduce_loss(*scored, num_items_in_batch)
        if loss is not None and read.aux_loss is not None:
            loss = loss + read.aux_loss
        use_cache = self.config.use_cache if use_cache is None else use_cache
        result = CausalLMOutputWithPast(
            loss=loss,
            logits=read.logits if logits_to_keep == 0 else read.logits[:, -logits_to_keep:],
            cache=cache.after(groups, input_ids.size(1)) if use_cache else None,
            hidden_states=read.hidden_states,
            attentions=read.attentions,
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return result if return_dict else result.to_tuple()

    def _read(
        self, tokens: Tensor, memory, recurrence: Recurrence | None, hidden_states: bool, attentions: bool
    ) -> Read:
        """The model over ``tokens`` (b, n), every one read, after ``memory``."""
        layers = self._recorder(hidden_states, attentions)
        segment = self._segment_rows(tokens.size(1))
        wrapped = hidden_states and segment.start > 0  # memory tokens around the segment
        with (
            attention_inputs(self.model, attentions, segment) as captured,
            segment_inputs(self.model, wrapped, segment) as read,
        ):
            out = self.model(tokens, memory, recurrence=recurrence, **layers)  # LMOutput: logits (b, n, V), new memory
        states = None if not layers else layers["layer_outputs"]
        if wrapped:  # each layer's input as it read it, then the head's
            states = [*read[: len(states) - 1], states[-1]]
        return Read(
            out.logits,
            out.mems,
            out.aux_loss,
            None if states is None else tuple(states),
            None if captured is None else tuple(captured),
        )

    def _read_rows(self, input_ids, keep, cache: LongseqCache, labels, hidden_states: bool, attentions: bool):
        """The model over each group of rows that share a memory and read as many tokens, each row its kept
        tokens (``keep`` (B, T); None: all): the outputs spread back to (B, T, ...), zeros where padding; the
        (scores, targets) pairs of the loss, each row shifted over its own tokens; the new groups."""
        if attentions:
            raise ValueError(
                "output_attentions is not available with padding or with rows of different memory lengths (a padded "
                "batch): each row attends to its own number of keys; ask for it row by row"
            )
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
        keep = torch.ones_like(input_ids, dtype=torch.bool) if keep is None else keep
        outputs, groups, scores, targets, aux = [], [], [], [], []
        for rows, memory, n in row_groups(cache.groups, keep.sum(1).cpu()):
            if n:
                at = rows.to(input_ids.device)
                where = keep[at]  # (g, T)
                tokens = input_ids[at][where].view(len(rows), n)
                read = self._read(tokens, memory, cache.recurrence, hidden_states, False)
                outputs.append((at, where, read))
                memory = read.memory
                if labels is not None:
                    scores.append(read.logits[:, :-1].reshape(-1, read.logits.size(-1)))
                    own = labels.to(input_ids.device)[at][where].view(len(rows), n)
                    targets.append(own[:, 1:].reshape(-1))
                if read.aux_loss is not None:
                    aux.append(read.aux_loss * len(rows))
            groups.append(RowGroup(tuple(rows.tolist()), memory))
        read = spread(outputs, keep, self.config.vocab_size, hidden_states)
        read = dataclasses.replace(read, aux_loss=sum(aux) / keep.size(0) if aux else None)
        scored = (torch.cat(scores), torch.cat(targets)) if scores else (None, None)
        return read, scored, merged(groups)

    def _kept(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
        """Where each row has a token to read (B, T) bool: ``attention_mask`` is 1 and the token is not the
        padding id, ``vocab_size`` (the first id after the vocabulary: the padding token of an export's
        tokenizer); None when every position is read.  Other ids outside the vocabulary are refused by name."""
        batch, length = input_ids.shape
        keep = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.size(0) != batch or attention_mask.size(1) < length:
                raise ValueError(
                    f"attention_mask of shape {tuple(attention_mask.shape)} must be (B, T) or (B, seen + T) for "
                    f"input_ids of shape {tuple(input_ids.shape)}"
                )
            mask = attention_mask[:, -length:]
            if not bool((mask == 1).all()):
                keep = mask.to(input_ids.device) == 1
        if torch.compiler.is_exporting():
            return keep  # an exported step reads no padding (data-dependent checks cannot be traced)
        vocab = self.config.vocab_size
        if bool((input_ids == vocab).any()):
            keep = (input_ids != vocab) if keep is None else keep & (input_ids != vocab)
        outside = (input_ids < 0) | (input_ids >= vocab)
        if keep is not None:
            outside &= keep
        if bool(outside.any()):
            row, position = (int(i) for i in outside.nonzero()[0])
            raise ValueError(
                f"input_ids[{row}, {position}] = {int(input_ids[row, position])} is outside the vocabulary of "
                f"{vocab} tokens (and not masked by attention_mask as padding)"
            )
        return keep

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
    def generate(self, inputs: Tensor | None = None, *args, **kwargs):
        """transformers' ``generate``, after an empty prompt is refused by name: ``input_ids`` of no tokens (B, 0),
        or rows that are all padding (``attention_mask`` 0 throughout); longseq's tokenizers have no BOS token to
        start from."""
        ids = kwargs.get("input_ids") if inputs is None else inputs
        if isinstance(ids, Tensor):
            refuse_empty_prompts(ids, kwargs.get("attention_mask"))
        return super().generate(inputs, *args, **kwargs)

    def _prepare_attention_mask_for_generation(self, inputs_tensor, generation_config, model_kwargs) -> Tensor:
        """transformers' mask (``input_ids != pad_token_id`` when the prompt holds that token and it is not the end
        token), kept where it masks a row's leading run of that token (left padding): the token anywhere else in
        a prompt is text, as it is without ``pad_token_id``."""
        mask = super()._prepare_attention_mask_for_generation(inputs_tensor, generation_config, model_kwargs)
        leading = (mask == 0).long().cumprod(dim=1)  # 1 up to a row's first unmasked token
        return 1 - leading

    def prepare_inputs_for_generation(
        self,
        input_ids: Tensor,  # (B, L): the prompt and the tokens drawn so far
        cache: LongseqCache | None = None,
        attention_mask: Tensor | None = None,  # (B, L): 0 where padding
        inputs_embeds: Tensor | None = None,
        use_cache: bool | None = True,
        logits_to_keep: int | None = None,
        **kwargs,
    ) -> dict:
        """As ``longseq generate``: the tokens but the last that the cache has not read (all of them without a
        cache) are read in segments of ``segment_len`` into its memory; then the last token is fed alone (its
        hidden states and attentions are the step's).  With padding, each row reads its own tokens so (segments
        from its first token) and feeds its own last one.  A model without a memory (absolute positions) reads its
        last ``segment_len`` tokens again every step."""
        if inputs_embeds is not None:
            raise ValueError("LongseqForCausalLM generates from input_ids, not inputs_embeds")
        kwargs.pop("next_sequence_length", None)
        kwargs.pop("is_first_iteration", None)
        inputs = {"use_cache": use_cache, **({"logits_to_keep": logits_to_keep} if logits_to_keep else {}), **kwargs}
        if windowed(self.model):
            window, mask = last_tokens(input_ids, self._kept(input_ids, attention_mask), self.config.segment_len)
            cache = LongseqCache(None, self.model.config.recurrence(mem_len=0))
            return {**inputs, "input_ids": window, "attention_mask": mask, "cache": cache}
        cache = longseq_cache(cache)
        if cache is None:
            cache = LongseqCache(None, self.model.config.recurrence(mem_len=self.config.sampling_mem_len))
        self._check_continues(cache, input_ids)
        keep = self._kept(input_ids[:, cache.seen :], attention_mask)  # of the columns not read yet
        if keep is None and cache.whole:
            memory = cache.memory
            if memory is None or input_ids.size(1) - 1 > cache.seen:  # read what the cache has not (maybe nothing)
                memory = memory if memory is not None else self._empty_memory()
                memory = read_prompt(
                    self.model, input_ids[:, cache.seen : -1], self.config.segment_len, cache.recurrence, memory
                )
                cache = LongseqCache(memory, cache.recurrence, input_ids.size(1) - 1)
            return {**inputs, "input_ids": input_ids[:, -1:], "cache": cache}
        fed, mask, cache = self._read_prompt_rows(input_ids, keep, cache)
        return {**inputs, "input_ids": fed, "attention_mask": mask, "cache": cache}

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs):
        """transformers' step, after a cache the user passed is made longseq's (an empty one: none)."""
        model_kwargs["cache"] = longseq_cache(model_kwargs.get("cache"))
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def _check_continues(self, cache: LongseqCache, input_ids: Tensor) -> None:
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
        held = cache.batch_size
        if held is not None and held != input_ids.size(0):
            raise ValueError(f"the cache holds {held} rows and input_ids has {input_ids.size(0)}")

    def _read_prompt_rows(self, input_ids: Tensor, keep: Tensor | None, cache: LongseqCache):
        """Each row's unread tokens but its last (``keep``: where the unread columns hold tokens), read into its
        memory (rows grouped by memory and count); the last token of every row (B, 1), a mask (B, 1) of the rows
        that have one (None: all), and the cache."""
        batch, length = input_ids.shape
        unread = input_ids[:, cache.seen :]
        new = (torch.ones_like(unread, dtype=torch.bool) if keep is None else keep).cpu()
        has = new.any(dim=1)
        if cache.seen == 0 and not bool(has.all()):
            raise ValueError(
                f"row {int((~has).nonzero()[0])} of input_ids is all padding: there is nothing to continue"
            )
        last = new.size(1) - 1 - new.flip(1).int().argmax(dim=1)  # each row's last kept column among the new ones
        read = new.clone()
        read[torch.arange(batch)[has], last[has]] = False
        groups = []
        for rows, memory, n in row_groups(cache.groups, read.sum(1)):
            memory = memory if memory is not None else self._empty_memory(joinable=True)
            if n:
                tokens = unread[rows.to(unread.device)][read[rows].to(unread.device)].view(len(rows), n)
                memory = read_prompt(self.model, tokens, self.config.segment_len, cache.recurrence, memory)
            groups.append(RowGroup(tuple(rows.tolist()), memory))
        fed = unread[torch.arange(batch, device=unread.device), last.to(unread.device)].view(batch, 1)
        mask = None if bool(has.all()) else has.view(batch, 1).long().to(input_ids.device)
        return fed, mask, LongseqCache(None, cache.recurrence, length - 1, merged(groups))

    def _assisted_decoding(self, *args, **kwargs):
        raise ValueError(
            "assisted decoding (assistant_model, prompt_lookup_num_tokens) rolls the cache back after rejected draft "
            "tokens, and a longseq memory cannot be rolled back (it has been truncated and compacted): generate "
            "without an assistant"
        )

    def _empty_memory(self, joinable: bool = False) -> Memory:
        """The memory generate starts from: ``longseq generate``'s (keys and values in ring buffers, written in
        place; hidden states for a compacted memory), or keys and values concatenated anew each step when rows
        must join (a padded batch: rings are never joined) or ``forward`` is compiled (``model.forward =
        torch.compile(model.forward)``): torch.compile's dynamic shapes cannot follow a ring's host-side indices
        (inductor fails with ``name 's0' is not defined``), and the concatenated memory reaches one shape once
        full.  Both give the same tokens."""
        if self.model.config.memory.compacted:
            return Memory.empty(HiddenMemory)
        compiled = getattr(self.forward, "_torchdynamo_orig_callable", None) is not None  # torch.compile's wrapper
        return Memory.empty(KVMemory if compiled or joinable else RingMemory)


@dataclass(frozen=True)
class Read:
    """What the model gives for a batch of rows: logits (B, T, V), the new memory, the compressors' loss, and the
    hidden states and attentions asked for."""

    logits: Tensor
    memory: Memory | None
    aux_loss: Tensor | None
    hidden_states: tuple[Tensor, ...] | None
    attentions: tuple[Tensor, ...] | None


def spread(outputs: list, keep: Tensor, vocab: int, hidden_states: bool) -> Read:
    """Every group's logits and hidden states (g, n, ...) put back at its rows' kept positions of (B, T, ...),
    zeros elsewhere; ``outputs`` holds (rows, where (g, T), Read) per group."""
    batch, length = keep.shape
    first = outputs[0][2] if outputs else None
    dtype = torch.float32 if first is None else first.logits.dtype
    logits = torch.zeros(batch, length, vocab, dtype=dtype, device=keep.device)
    layers = None
    if hidden_states and first is not None:
        layers = [h.new_zeros(batch, length, h.size(-1)) for h in first.hidden_states]
    for rows, where, read in outputs:
        logits[rows] = _placed(read.logits, where)
        for full, h in zip(layers or (), read.hidden_states or ()):
            full[rows] = _placed(h, where)
    return Read(logits, None, None, None if layers is None else tuple(layers), None)


def _placed(values: Tensor, where: Tensor) -> Tensor:
    """(g, n, C) values at the n True positions of each row of ``where`` (g, T): (g, T, C), zeros elsewhere."""
    out = values.new_zeros(*where.shape, values.size(-1))
    out[where] = values.reshape(-1, values.size(-1))
    return out


def last_tokens(input_ids: Tensor, keep: Tensor | None, window: int) -> tuple[Tensor, Tensor | None]:
    """Each row's last ``window`` kept tokens, left-padded to one width (B, w), and their mask (None: no
    padding): what a model without a memory reads every step."""
    if keep is None:
        return input_ids[:, -window:], None
    rows = [ids[kept][-window:] for ids, kept in zip(input_ids, keep)]
    width = max(len(r) for r in rows)
    out = input_ids.new_zeros(len(rows), width)
    mask = torch.zeros_like(out)
    for i, r in enumerate(rows):
        out[i, width - len(r) :], mask[i, width - len(r) :] = r, 1
    return out, mask


@contextmanager
def attention_inputs(model: TransformerXLLM, wanted: bool, rows: slice):
    """With ``wanted``, a list that fills, as ``model`` runs, with every attention layer's probabilities (B, H, T,
    K) of the queries ``rows`` (the segment's, memory tokens cut away), in order: each layer's output is computed
    from them by the readable reference (``RelativeMultiHeadAttention.applied``) in place of its kernel's, so that
    the maps are in the autograd graph (``retain_grad`` on one gets its gradient) and are the ones applied.  A
    ring key/value cache (written in place by the layer) is read as the keys and values it held before the layer
    ran."""
    if not wanted:
        yield None
        return
    captured: list[Tensor] = []
    inputs: dict[int, tuple] = {}

    def before(module, args):
        args = list(args)  # (hidden, rel_key, r_w_bias, r_r_bias, mask, context)
        context = args[5] if len(args) > 5 else None
        if isinstance(context, RingContext):
            args[5] = CacheContext(*context.ring.held())
        inputs[id(module)] = tuple(args[:6])

    def after(module, args, output):
        out, probs = module.applied(*inputs.pop(id(module)), rows=rows)
        captured.append(probs)
        return (out, *output[1:])

    layers = [layer.dec_attn for layer in model.transformer.stack.layers if layer.attends]
    handles = [hook for m in layers for hook in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def refuse_empty_prompts(input_ids: Tensor, attention_mask: Tensor | None) -> None:
    """An empty prompt to ``generate`` (no tokens, or a row all padding) is a ``ValueError`` that says so: there is
    no token to continue from (the cache's count of tokens read was the message)."""
    rows = input_ids.size(0) if input_ids.dim() == 2 else 1
    if input_ids.numel() == 0:
        what = "the prompt is empty" if rows == 1 else f"every prompt of the batch of {rows} is empty"
        raise ValueError(
            f"generate(): {what} (input_ids of shape {tuple(input_ids.shape)}): give at least one token, e.g. the "
            "newline's id or a word; longseq's tokenizers have no BOS token to start from"
        )
    if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape == input_ids.shape:
        empty = (~attention_mask.bool().any(dim=1)).nonzero().flatten().tolist()
        if empty:
            rows = f"row {empty[0]} of input_ids is" if len(empty) == 1 else f"rows {', '.join(map(str, empty))} are"
            raise ValueError(
                f"generate(): {rows} all padding (attention_mask 0 throughout), an empty prompt: give each row at "
                "least one token"
            )


@contextmanager
def segment_inputs(model: TransformerXLLM, wanted: bool, segment: slice):
    """With ``wanted`` (memory tokens wrap the segment), a list that fills with each layer's input rows of the
    segment (B, T, E), in order: each layer reads them put back between the memory tokens' rows (the same values),
    so that they are the rows it read and ``retain_grad`` on one gets its gradient.  (A layer recomputed in the
    backward pass, activation checkpointing, adds its input again after the first pass's.)"""
    if not wanted:
        yield None
        return
    read: list[Tensor] = []

    def hook(module, args):
        hidden = args[0]  # (B, T', E)
        rows = hidden[:, segment]
        read.append(rows)
        return (torch.cat([hidden[:, : segment.start], rows, hidden[:, segment.stop :]], dim=1), *args[1:])

    handles = [layer.register_forward_pre_hook(hook) for layer in model.transformer.stack.layers]
    try:
        yield read
    finally:
        for handle in handles:
            handle.remove()


def _has_old_names(directory) -> bool:
    """Whether the local export ``directory`` names its tensors as longseq did before (:func:`has_old_names`); only
    the header of its ``model.safetensors`` is read."""
    path = os.path.join(str(directory), "model.safetensors")
    if not os.path.isfile(path):
        return False
    with safe_open(path, "pt") as f:
        names = list(f.keys())
    return has_old_names(names)


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
    return reduce_loss(scores[:, :-1].reshape(-1, scores.size(-1)), labels[:, 1:].reshape(-1), num_items_in_batch)


def reduce_loss(flat: Tensor | None, target: Tensor | None, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """The cross-entropy of scores (N, V) on targets (N,) (-100 ignored): their mean, or their sum over
    ``num_items_in_batch``; None scores (nothing to score) give NaN for the mean, as an empty mean does."""
    if flat is None:
        return torch.tensor(float("nan"))
    flat, target = flat.float(), target.long().to(flat.device)
    if num_items_in_batch is None:
        return F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX)
    return F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX, reduction="sum") / num_items_in_batch


def longseq_cache(given) -> LongseqCache | None:
    """The cache a transformers user passed as ``cache`` (or ``past_key_values``), as longseq's: a
    :class:`LongseqCache`, or None for no memory (None, or an empty transformers ``Cache`` such as ``DynamicCache()``,
    tuple or list: nothing read yet).  A cache that holds keys and values in another layout (transformers' own, or
    the legacy tuples) cannot be read by a longseq model and is refused by name."""
    if given is None or isinstance(given, LongseqCache):
        return given
    if isinstance(given, Cache):
        if given.get_seq_length() == 0:
            return None
        held = f"a {type(given).__name__} that holds {given.get_seq_length()} positions"
    elif isinstance(given, (tuple, list)):
        if not given:
            return None
        held = f"a {type(given).__name__} of {len(given)} entries (the legacy key/value format)"
    else:
        held = f"a {type(given).__name__}"
    raise TypeError(
        f"cache (past_key_values) is {held}; a longseq model keeps its memory in a LongseqCache "
        "(from longseq.hf import LongseqCache): pass the cache that this model's forward or generate() returned, or "
        "none to start afresh"
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
    config = LongseqConfig(
        longseq=model.config.to_dict(),
        segment_len=segment_len,
        generate_mem_len=generate_mem_len,
    )
    hf = LongseqForCausalLM(config, tokenizer)
    hf.model.load_state_dict(model.state_dict())
    return hf.to(next(model.parameters()).dtype).eval()


AutoConfig.register(MODEL_TYPE, LongseqConfig)
AutoModelForCausalLM.register(LongseqConfig, LongseqForCausalLM)
