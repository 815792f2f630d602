"""Low-rank adapters (LoRA, Hu et al., 2021) for fine-tuning, through PEFT (an optional dependency, imported here
only): W x + (alpha / r) B A x on the linear modules a run names (``FinetuneOptions.lora_targets``), A and B the
only weights that train, B starting at zero so that the adapted model starts as the base one.

PEFT wraps each target in place (``qkv_net`` becomes a ``lora.Linear`` whose ``base_layer`` is the old linear), so
a run's checkpoints hold ``...qkv_net.base_layer.weight`` beside ``...qkv_net.lora_A.default.weight``: a task whose
options ask for adapters builds its model with them (:func:`add_adapters`), the base checkpoint's weights go in
under the wrapped names (:func:`base_state`), and :func:`merge_adapters` folds them into plain linears, as a
checkpoint loads for use (``eval``, ``generate``, ``predict``, ``convert``).
"""

from __future__ import annotations

from torch import nn

from longseq.config.base import ConfigError


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("lora_rank > 0 trains adapters through PEFT: pip install peft") from None
    return peft


def add_adapters(model: nn.Module, rank: int, alpha: float, dropout: float, targets: list[str]) -> nn.Module:
    """``model`` with LoRA adapters of ``rank`` on every linear module whose name ends in one of ``targets``
    (in place); a target that names no linear module is refused by name."""
    peft = _peft()
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        shown = sorted(
            {n.split(".")[-1] if not n.split(".")[-1].isdigit() else ".".join(n.split(".")[-2:]) for n in names}
        )
        raise ConfigError(f"lora_targets {missing} name no linear module of this model; its linears: {shown}")
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets))
    return peft.inject_adapter_in_model(config, model)


def adapted(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that hold adapters."""
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' weights (what trains)."""
    return [p for name, p in model.named_parameters() if ".lora_" in name]


def base_state(model: nn.Module, state: dict) -> dict:
    """A plain model's ``state`` under ``model``'s names, whose adapted linears hold their weights under
    ``base_layer``; the adapters keep their own initialisation."""
    wrapped = {name for name, module in model.named_modules() if hasattr(module, "base_layer")}
    out = {}
    for key, value in state.items():
        owner, _, leaf = key.rpartition(".")
        out[f"{owner}.base_layer.{leaf}" if owner in wrapped else key] = value
    own = model.state_dict()
    out.update({k: v for k, v in own.items() if ".lora_" in k})
    return out


def merge_adapters(model: nn.Module) -> nn.Module:
    """``model`` with every adapter folded into its linear (W + (alpha / r) B A) and the wrapper replaced by that
    linear (in place): the plain model, with the plain names, computing what the adapted one does (without the
    adapters' dropout)."""
    if not any(".lora_" in name for name, _ in model.named_parameters()):
        return model
    _peft()
    parents = dict(model.named_modules())
    for name, module in list(model.named_modules()):
        if hasattr(module, "base_layer") and hasattr(module, "merge"):
            module.merge()
            owner, _, leaf = name.rpartition(".")
            setattr(parents[owner] if owner else model, leaf, module.get_base_layer())
    return model
