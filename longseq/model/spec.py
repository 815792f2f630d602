"""What the trainer, the checkpoint reader and the integrations ask of an architecture, so that none of them reaches
into its modules: one :class:`ModelSpec` per architecture, registered beside the model classes in
:data:`longseq.model.registry.MODEL_SPECS` (as torchtitan's ``ModelSpec`` carries ``parallelize_fn`` and
``state_dict_adapter``).

Every function takes ``model``: the language model, or a task's model that holds one (a classifier, a span
extractor); the spec finds its language model, and its layers, by their classes, never by attribute paths or
parameter names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from longseq.config.base import ConfigError
from longseq.model.adaptive import AdaptiveEmbedding
from longseq.model.lstm import LSTMLM
from longseq.model.stack import LayerStack
from longseq.model.transformer import TransformerXLLM


@dataclass(frozen=True)
class ModelSpec:
    """One architecture as the code around it sees it.

    * ``build``: the language model's class, called with a :class:`~longseq.config.model.ModelConfig`.
    * ``fsdp_units(model)``: the modules FSDP shards one by one, inner first, the language model last (``model``
      itself, when it holds the language model, is sharded after them, as the root); None: it cannot be sharded.
    * ``layer_depths(model)``: every trainable name of ``model.named_parameters()`` with its depth for layer-wise
      learning-rate decay and the per-depth gradient norms: 0 for the embedding, i + 1 for layer i, and
      ``n_layer`` + 1 for everything above the layers (the softmax, u and v, the memory's policies, a task's head).
    * ``set_activation_checkpointing(model, k)``: recompute every k-th layer in the backward pass (0: off).
    * ``tied_heads``: the softmax weight a checkpoint with ``tie_weight`` stores under the embedding's name, as
      ``{regular expression of its name: the embedding's name}`` (names relative to the language model).
    """

    build: type[nn.Module]
    fsdp_units: Callable[[nn.Module], list[nn.Module]] | None
    layer_depths: Callable[[nn.Module], dict[str, int]]
    set_activation_checkpointing: Callable[[nn.Module, int], None]
    tied_heads: dict[str, str] = field(default_factory=dict)


def first_of(model: nn.Module, cls: type[nn.Module]) -> nn.Module:
    """``model`` itself when it is a ``cls``, else the one ``cls`` inside it (a task's model holds its LM)."""
    found = [m for m in model.modules() if isinstance(m, cls)]
    if not found:
        raise TypeError(f"{type(model).__name__} holds no {cls.__name__}")
    return found[0]


def depths_by_parameter(model: nn.Module, lm: nn.Module, parts: dict[int, int]) -> dict[str, int]:
    """Every name of ``model.named_parameters()`` with the depth ``parts`` gives its tensor (by ``id``), or the top,
    ``lm.config.n_layer`` + 1.  A tensor tied to another is named once, as PyTorch names it first."""
    top = lm.config.n_layer + 1
    return {name: parts.get(id(param), top) for name, param in model.named_parameters()}


# --- Transformer-XL ---------------------------------------------------------------------------------------------


def _outer_stack(model: nn.Module) -> LayerStack:
    """The language model's layer stack (its backbone's ``stack``: the first in module order; an hourglass's
    shortened stack lies inside one of its layers)."""
    return first_of(first_of(model, TransformerXLLM), LayerStack)


def xl_fsdp_units(model: nn.Module) -> list[nn.Module]:
    """One unit per layer of the stack (an hourglass block is one), then the language model: its embedding,
    softmax, u and v and memory policies are the root unit's."""
    return [*_outer_stack(model).layers, first_of(model, TransformerXLLM)]


def xl_layer_depths(model: nn.Module) -> dict[str, int]:
    """The embedding (its projections too) at 0, the stack's layer i at i + 1, the rest at the top."""
    lm = first_of(model, TransformerXLLM)
    parts = {id(p): 0 for p in first_of(lm, AdaptiveEmbedding).parameters()}
    for i, layer in enumerate(_outer_stack(lm).layers):
        parts.update({id(p): i + 1 for p in layer.parameters()})
    return depths_by_parameter(model, lm, parts)


def xl_set_activation_checkpointing(model: nn.Module, every: int) -> None:
    """Every ``every``-th layer of the outer stack recomputed in the backward pass (an hourglass block whole)."""
    _outer_stack(model).activation_checkpointing = every


TRANSFORMER_XL = ModelSpec(
    build=TransformerXLLM,
    fsdp_units=xl_fsdp_units,
    layer_depths=xl_layer_depths,
    set_activation_checkpointing=xl_set_activation_checkpointing,
    tied_heads={r"crit\.out_layers\.(\d+)\.weight": r"transformer.word_emb.emb_layers.\1.weight"},
)


# --- the LSTM baseline ------------------------------------------------------------------------------------------


def lstm_layer_depths(model: nn.Module) -> dict[str, int]:
    """The embedding at 0; ``nn.LSTM``'s weights and biases of layer k (``weight_ih_l{k}``, ``bias_hh_l{k}``) at
    k + 1; the decoder (tied or not) at the top."""
    lm = first_of(model, LSTMLM)
    parts = {id(p): 0 for p in lm.embedding.parameters()}
    for name, param in lm.lstm.named_parameters():
        kind, layer = name.rsplit("_l", 1)
        if kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            parts[id(param)] = int(layer.split("_")[0]) + 1
    return depths_by_parameter(model, lm, parts)


def lstm_set_activation_checkpointing(model: nn.Module, every: int) -> None:
    if every:
        raise ConfigError(
            f"activation_checkpointing={every} recomputes a transformer's layers; the LSTM baseline (arch=lstm) has "
            "none: set activation_checkpointing=0"
        )


LSTM = ModelSpec(
    build=LSTMLM,
    fsdp_units=None,  # train.distributed.shard_model refuses parallel=fsdp for arch=lstm by name
    layer_depths=lstm_layer_depths,
    set_activation_checkpointing=lstm_set_activation_checkpointing,
    tied_heads={r"decoder\.weight": "embedding.weight"},
)
