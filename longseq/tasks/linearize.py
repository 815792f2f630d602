"""Linearization, as LoLCATs (Zhang et al., 2024), RADLADS and Llamba do it: a student made from a trained
attention model by replacing chosen attention layers with mixers of the linear-attention family, initialised from
the attention's own weights, then taught to give what those layers gave (:mod:`longseq.tasks.transfer`, then
distillation).  This module makes the student and measures which layers cost least to replace.

The student's config is the teacher's with ``mixer`` naming the new kind at the chosen layers.  Its weights are
the teacher's, by their state-dict names, except in a replaced layer ``i`` (``transformer.stack.layers.i.``)::

    teacher (attention layer)                    student (mixer layer)
    dec_attn.qkv_net.weight   rows Q | K | V     mixer.qkv.weight        rows Q | K' | V'
    dec_attn.o_net.weight                        mixer.out_proj.weight
    dec_attn.layer_norm.*                        layer_norm.*            (the sub-layer's norm, pre- or post-)
    pos_ff.*                                     pos_ff.*

where Q is ``n_head`` heads of ``d_head`` rows and K, V are ``n_kv_head`` heads: K' and V' give every query head
``h`` the key/value head the attention gives it, ``h // (n_head / n_kv_head)`` (grouped-query attention's
``repeat_interleave``, :func:`expand_kv`).  The attention's position encoding (a sinusoidal table's projection,
rotary angles), its q/k norms (``qk_norm``) and u, v have no place in a mixer and are left behind (listed in
:attr:`Linearized.dropped`); the mixer's own parameters (output gate and norm, decay, beta, short-convolution taps)
keep their initialisation (:attr:`Linearized.own`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.config.base import ConfigError
from longseq.config.model import ModelConfig
from longseq.data.batching import OrderedStream
from longseq.model import build_model

LINEARIZABLE = ("gla", "delta", "retention", "linear")  # mixers whose q, k, v, o take the attention's
QKV, OUT, NORM = "dec_attn.qkv_net.weight", "dec_attn.o_net.weight", "dec_attn.layer_norm."


def layer_prefix(i: int) -> str:
    """The state-dict prefix of layer ``i`` of a language model's stack."""
    return f"transformer.stack.layers.{i}."


def attention_layers(config: ModelConfig) -> list[int]:
    """The layers of ``config`` that are attention, which a student may replace; refused by name when there are
    none or the model is of a kind the transfer cannot start from."""
    if config.arch != "transformer":
        raise ConfigError(f"arch={config.arch} has no attention layers to linearize")
    if config.hourglass.shorten_layers:
        raise ConfigError(
            f"hourglass.shorten_layers={config.hourglass.shorten_layers}: an hourglass's shortened layers are not "
            "the stack's own; linearize a model without an hourglass"
        )
    if config.pattern.bidirectional:
        raise ConfigError("pattern.bidirectional: the linear-attention mixers are causal; a bidirectional teacher "
                          "cannot be linearized")  # fmt: skip
    if config.pattern.lowrank:
        raise ConfigError(f"pattern.lowrank={config.pattern.lowrank}: Linformer's layers attend to mixtures of the "
                          "keys, not to each key; linearize a model without it")  # fmt: skip
    found = [i for i, name in enumerate(config.layer_mixers) if name == "attention"]
    if not found:
        raise ConfigError(f"the model has no attention layers to replace (mixer={','.join(config.layer_mixers)})")
    return found


def student_config(teacher: ModelConfig, layers: list[int], mixer: str) -> ModelConfig:
    """The teacher's config with ``mixer`` at ``layers`` (each an attention layer of the teacher)."""
    if mixer not in LINEARIZABLE:
        raise ConfigError(
            f"mixer {mixer!r} cannot take an attention's weights: linearize into one of {', '.join(LINEARIZABLE)}"
        )
    attending = attention_layers(teacher)
    for i in layers:
        if not 0 <= i < teacher.n_layer:
            raise ConfigError(f"layer {i} is out of range: the model has layers 0 .. {teacher.n_layer - 1}")
        if i not in attending:
            raise ConfigError(f"layer {i} is a {teacher.layer_mixers[i]} layer, not attention: nothing to replace")
    names = [mixer if i in layers else name for i, name in enumerate(teacher.layer_mixers)]
    changes: dict = {"mixer": names}
    if teacher.memory.mem_bptt > 1 and layers:  # a step's window reads the mixers' states as it reads the memory
        changes["state_bptt"] = teacher.memory.mem_bptt
    return teacher.replace(**changes)


def replaced_layers(teacher: ModelConfig, student: ModelConfig) -> list[int]:
    """The layers where ``student`` has a mixer and ``teacher`` attention; every other layer must be the same."""
    if teacher.n_layer != student.n_layer:
        raise ConfigError(f"the student has {student.n_layer} layers, its teacher {teacher.n_layer}")
    pairs = list(zip(teacher.layer_mixers, student.layer_mixers))
    other = [i for i, (t, s) in enumerate(pairs) if t != s and t != "attention"]
    if other:
        raise ConfigError(f"layers {other} are not attention in the teacher and differ in the student")
    return [i for i, (t, s) in enumerate(pairs) if t == "attention" and s != "attention"]


def expand_kv(weight: Tensor, n_head: int, n_kv_head: int, d_head: int) -> Tensor:
    """Key or value rows (n_kv_head D, E) as (n_head D, E): query head h reads key/value head h // group, as the
    attention's ``repeat_interleave`` shares them."""
    group = n_head // n_kv_head
    return weight.view(n_kv_head, d_head, -1).repeat_interleave(group, dim=0).reshape(n_head * d_head, -1)


def mixer_qkv(qkv: Tensor, config: ModelConfig) -> Tensor:
    """An attention's fused rows (Q: n_head heads; K, V: n_kv_head heads) as a mixer's (3 n_head heads)."""
    h, kv, d = config.n_head, config.n_kv_head or config.n_head, config.d_head
    q, k, v = qkv.split((h * d, kv * d, kv * d), dim=0)
    return torch.cat([q, expand_kv(k, h, kv, d), expand_kv(v, h, kv, d)], dim=0)


@dataclass(frozen=True)
class Linearized:
    """What :func:`init_from_teacher` did: the layers it replaced, the teacher's tensors it left behind, and the
    student's tensors that kept their initialisation (the mixers' own)."""

    layers: tuple[int, ...]
    dropped: tuple[str, ...]
    own: tuple[str, ...]


def mapped_name(name: str, layers: list[int]) -> str | None:
    """The student's name of the teacher's tensor ``name``, or None where it has none (left behind)."""
    for i in layers:
        p = layer_prefix(i)
        if not name.startswith(p):
            continue
        rest = name[len(p) :]
        if rest == QKV:
            return p + "mixer.qkv.weight"
        if rest == OUT:
            return p + "mixer.out_proj.weight"
        if rest.startswith(NORM):
            return p + "layer_norm." + rest[len(NORM) :]
        return name if rest.startswith("pos_ff.") else None
    return name


@torch.no_grad()
def init_from_teacher(student: nn.Module, teacher_state: dict[str, Tensor], config: ModelConfig,
                      layers: list[int]) -> Linearized:  # fmt: skip
    """Set ``student`` (built from :func:`student_config` of the teacher's ``config`` and ``layers``) from the
    teacher's state dict as the module docstring says; any other difference between the two is refused by name."""
    own = student.state_dict()
    given, dropped = {}, []
    for name, tensor in teacher_state.items():
        target = mapped_name(name, layers)
        if target is None or target not in own:  # u and v of a stack left without attention have no place
            dropped.append(name)
            continue
        given[target] = mixer_qkv(tensor, config) if target.endswith("mixer.qkv.weight") else tensor
    missing = [n for n in own if n not in given and not any(n.startswith(layer_prefix(i) + "mixer.") for i in layers)]
    wrong = [n for n, t in given.items() if t.shape != own[n].shape]
    stray = [n for n in dropped if not any(n.startswith(layer_prefix(i)) for i in layers) and "r_w_bias" not in n
             and "r_r_bias" not in n]  # fmt: skip
    faults = {"not in the teacher": missing, "another shape": wrong, "no place in the student": stray}
    if any(faults.values()):
        said = "; ".join(f"{what}: {', '.join(names[:4])}" for what, names in faults.items() if names)
        raise ConfigError(f"the student is not its teacher's stack with mixers in place of attention: {said}")
    for name, tensor in given.items():
        own[name].copy_(tensor)
    return Linearized(tuple(layers), tuple(dropped), tuple(n for n in own if n not in given))


def linearized_model(teacher_state: dict[str, Tensor], config: ModelConfig, layers: list[int], mixer: str,
                     transferred: dict[str, Tensor] | None = None) -> nn.Module:  # fmt: skip
    """The student with ``mixer`` at ``layers``, from the teacher's weights; with ``transferred`` (the state dict of
    a student whose mixers were trained at these layers, or at more), those layers' weights from it."""
    student = build_model(student_config(config, layers, mixer))
    init_from_teacher(student, teacher_state, config, layers)
    if transferred is not None:
        own = student.state_dict()
        with torch.no_grad():
            for name, tensor in own.items():
                if any(name.startswith(layer_prefix(i)) for i in layers):
                    if name not in transferred:
                        raise ConfigError(f"the transferred weights have no {name}: they replaced other layers")
                    tensor.copy_(transferred[name])
    return student.eval()


@torch.no_grad()
def layer_kls(teacher: nn.Module, students: dict[int, nn.Module], ids: np.ndarray, batch_size: int, tgt_len: int,
              max_segments: int = 0) -> dict[int, float]:  # fmt: skip
    """KL(teacher || student) in nats a token, the mean over the positions of ``ids`` read as evaluation reads them
    (ordered streams, every model's memory carried; the first ``max_segments`` segments, 0: all), for each student
    (one layer replaced each, keyed by that layer)."""
    models = [teacher, *students.values()]
    for model in models:
        model.eval()
    stream = OrderedStream(ids, batch_size, tgt_len)
    mems: list = [None] * len(models)
    totals, count, read = [0.0] * len(students), 0, 0
    while (segment := stream.next_segment(cycle=False)) is not None and (not max_segments or read < max_segments):
        outs = [model(segment.input_ids, mem) for model, mem in zip(models, mems)]
        mems = [out.mems for out in outs]
        target = F.log_softmax(outs[0].logits.double(), dim=-1)  # (B, T, V)
        for j, out in enumerate(outs[1:]):
            student = F.log_softmax(out.logits.double(), dim=-1)
            totals[j] += float((target.exp() * (target - student)).sum())
        count, read = count + segment.input_ids.numel(), read + 1
    if not count:
        raise ConfigError("no text to measure the layers' KL on: the validation split is shorter than one segment")
    return {i: total / count for i, total in zip(students, totals)}


def choose_layers(candidates: list[int], count: int, how: str, kls: dict[int, float] | None = None) -> list[int]:
    """``count`` of ``candidates``: those of lowest KL (``kl``), or the last of each of ``count`` equal groups
    (``spread``)."""
    if not 1 <= count <= len(candidates):
        raise ConfigError(f"cannot replace {count} of the {len(candidates)} attention layers")
    if how == "kl":
        if kls is None:
            raise ConfigError("--select kl needs the layers' KL (measured after transferring every layer)")
        return sorted(sorted(candidates, key=lambda i: (kls[i], i))[:count])
    if how == "spread":
        return [candidates[math.floor((j + 1) * len(candidates) / count) - 1] for j in range(count)]
    raise ConfigError(f"select={how!r}: choose the layers by kl or spread")


def layer_count(n_attention: int, count: int | None = None, ratio: float | None = None) -> int:
    """How many of ``n_attention`` attention layers to replace: ``count`` of them, or the fraction ``ratio`` in
    (0, 1] (rounded, at least one)."""
    if (count is None) == (ratio is None):
        raise ConfigError("say how many layers to replace: a count or a ratio (or the layers themselves)")
    if ratio is not None:
        if not 0 < ratio <= 1:
            raise ConfigError(f"ratio {ratio:g} must be in (0, 1]: the fraction of the attention layers to replace")
        return max(1, round(ratio * n_attention))
    if not 1 <= count <= n_attention:
        raise ConfigError(f"cannot replace {count} layers: the model has {n_attention} attention layers")
    return count
