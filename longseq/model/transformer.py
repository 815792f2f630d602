"""The Transformer-XL backbone and language model (Dai et al., 2019).

Reads top to bottom: the backbone (the embedding and a :class:`~longseq.model.stack.LayerStack`), then the language
model, whose ``forward`` is the one entry point: it embeds, runs the stack and scores.  Tensors are batch-first;
see :mod:`longseq.model.attention` for the dimension glossary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from longseq.config.model import ModelConfig, Recurrence
from longseq.model.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from longseq.model.attention.patterns import PATTERNS
from longseq.model.block import Dropout, norm_layer
from longseq.model.memory import Memory, MemoryStep, as_memory
from longseq.model.stack import LayerStack

IGNORE_INDEX = -100

__all__ = ["IGNORE_INDEX", "LMOutput", "TransformerXL", "TransformerXLLM"]


NORM_WEIGHTS = ("layer_norm.weight", "final_norm.weight", "q_norm.weight", "k_norm.weight")  # initialised at 1 +- std


class TransformerXL(nn.Module):
    """The backbone: the token embedding, the layer stack over a recurrence memory (``stack``, a
    :class:`~longseq.model.stack.LayerStack`) and, with ``final_norm``, a norm after it.
    :meth:`TransformerXLLM.forward` runs them.

    Its weights are ``transformer.word_emb.*``, ``transformer.stack.*`` and ``transformer.final_norm.*``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.stack = LayerStack(c)  # registered first: the parameters keep the order (the optimizer's state) they had
        self.word_emb = AdaptiveEmbedding(c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val, c.embed_scale)
        self.final_norm = norm_layer(c.norm, c.d_model, c.layer_norm_eps, c.bias) if c.final_norm else None
        self.drop = Dropout(c.dropout)

    def begin(
        self, input_ids: Tensor, memory: Memory, recurrence: Recurrence, doc_ids: Tensor | None = None
    ) -> tuple[MemoryStep, Tensor]:
        """The memory step of one pass over ``input_ids`` (B, T) and the embedded segment (B, T', E) as the step
        wraps it (with memory tokens around it, T' > T)."""
        step = self.stack.open_step(memory, *input_ids.shape, input_ids.device, recurrence, doc_ids)
        return step, self.drop(step.wrap(self.stack.encoding.embed(self.word_emb(input_ids))))

    def end(self, hidden: Tensor, layer_outputs: list | None = None) -> Tensor:
        """The stack's output (B, T, E) as the head reads it: after the final norm (``final_norm``) and the dropout;
        the last of ``layer_outputs`` becomes that tensor before the dropout (after the norm, as transformers' models
        give it; the segment's rows only where memory tokens wrapped it), so that it is the one the head reads."""
        last = None if layer_outputs is None else layer_outputs[-1]
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
        if last is not None and (self.final_norm is not None or last.size(1) != hidden.size(1)):
            layer_outputs[-1] = hidden  # the very tensor the head reads (memory tokens stripped, normed)
        return self.drop(hidden)


@dataclass
class LMOutput:
    """``loss``: mean NLL over labelled tokens (or None; NaN when labels were given but none is kept); ``logits``:
    (B, T, V) logits, or full log-probabilities with adaptive softmax (None when labels were given, or with
    ``return_hidden``); ``nll``: per-token NLL (B, T), 0 where ignored; ``mems``: the new
    :class:`~longseq.model.memory.Memory` (``mems[i]`` is layer i's (B, M, E) states); ``aux_loss``:
    in training, the compressors' attention-reconstruction loss with a learned compressed memory and a dynamic
    hourglass's boundary loss (H-Net's ratio loss; the entropy head's and threshold's losses): add it to the loss;
    else None; ``hidden``: with ``return_hidden``, the last layer's hidden states (B, T, E) that the softmax
    scores (``model.head(hidden)``), else None."""

    loss: Tensor | None
    logits: Tensor | None
    nll: Tensor | None
    mems: Memory
    aux_loss: Tensor | None = None
    hidden: Tensor | None = None


class TransformerXLLM(nn.Module):
    """Transformer-XL language model: ``model(input_ids, mems=None, labels=None) -> LMOutput``.

    ``labels[b, t]`` is the target of position t (the next token of the stream); -100 is ignored.
    ``recurrence`` (a :class:`~longseq.config.model.Recurrence`: ``mem_len``, ``clamp_len``, ``same_length``)
    may differ per call from the model's own (``config.recurrence()``), e.g. for evaluation with a longer memory
    than in training: ``recurrence=config.recurrence(mem_len=640)``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.transformer = TransformerXL(c)
        self.crit = AdaptiveLogSoftmax(
            c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val, c.logit_softcap, c.head_bias
        )
        self.init_weights()
        self.tie_weights()

    def init_weights(self) -> None:
        """The paper's initialisation.

        * Linear, embedding and softmax weights, u and v: normal(0, ``init_std`` = 0.02) (u and v 0 with
          ``uv_init="zeros"``); biases 0.
        * Embedding and softmax projections (``emb_projs``, ``out_projs``): normal(0, ``proj_init_std`` = 0.01).
        * Norm weights (LayerNorm or RMSNorm: ``layer_norm``, ``final_norm``, and QK-norm's ``q_norm``, ``k_norm``)
          normal(1, ``init_std``), biases 0.
        * Cluster weights of the adaptive softmax normal(0, ``init_std``), cluster biases 0.
        * Then every module with parameters of its own kind (the ssm's A, dt, D and norm, the convolution's taps,
          the LSTM mixer) initialises them again with ``init_own_parameters()``.
        """
        std, proj_std = self.config.init_std, self.config.proj_init_std
        for name, param in self.named_parameters():
            if "emb_projs" in name or "out_projs" in name:
                nn.init.normal_(param, 0.0, proj_std)
            elif name.endswith(NORM_WEIGHTS):
                nn.init.normal_(param, 1.0, std)
            elif name.endswith("bias") and "r_w_bias" not in name and "r_r_bias" not in name:
                nn.init.zeros_(param)
            elif ("r_w_bias" in name or "r_r_bias" in name) and self.config.uv_init == "zeros":
                nn.init.zeros_(param)
            else:
                nn.init.normal_(param, 0.0, std)
        for module in self.modules():
            if hasattr(module, "init_own_parameters"):
                module.init_own_parameters()

    def tie_weights(self) -> None:
        """Share softmax weights with the embedding (``tie_weight``) and projections (``tie_projs``)."""
        c, emb, crit = self.config, self.transformer.word_emb, self.crit
        if c.tie_weight:
            for i in range(len(crit.out_layers)):
                crit.out_layers[i].weight = emb.emb_layers[i].weight
        for i, tie in enumerate(c.proj_ties):
            if not tie:
                continue
            if c.div_val == 1 and c.d_model != c.embed_dim:
                crit.out_projs[i] = emb.emb_projs[0]
            elif c.div_val != 1:
                crit.out_projs[i] = emb.emb_projs[i]

    def _check_inputs(self, input_ids: Tensor, memory: Memory, labels: Tensor | None, global_mask) -> None:
        c = self.config
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a (batch, time) tensor, got shape {shape}")
        if input_ids.dtype not in (torch.int64, torch.int32) or input_ids.numel() == 0:
            raise ValueError(
                f"input_ids must be a non-empty integer tensor, got {input_ids.dtype} {tuple(input_ids.shape)}"
            )
        in_range = ((input_ids >= 0) & (input_ids < c.vocab_size)).all()
        torch._assert_async(in_range, f"token ids must lie in [0, {c.vocab_size})")  # on the device: no host read
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
        if labels is not None and (labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool):
            raise ValueError(f"labels must be integer token ids (-100: ignored), got {labels.dtype}")
        memory.check_dtype(self.crit.out_layers[0].weight.dtype, torch.is_autocast_enabled(input_ids.device.type))
        if global_mask is not None:
            if not any(p.has_global for p in self.transformer.stack.patterns):
                names = " or ".join(name for name, kind in PATTERNS.items() if kind.has_global)
                raise ValueError(f"global_mask needs a {names} attention pattern, the model has {c.pattern.attention}")
            if not isinstance(global_mask, Tensor) or global_mask.shape != input_ids.shape:
                shape = tuple(global_mask.shape) if isinstance(global_mask, Tensor) else type(global_mask).__name__
                raise ValueError(f"global_mask must have the input's shape {tuple(input_ids.shape)}, got {shape}")

    def forward(
        self,
        input_ids: Tensor,  # (B, T)
        mems: Memory | None = None,
        labels: Tensor | None = None,  # (B, T)
        *,
        recurrence: Recurrence | None = None,  # None: the model's own
        doc_ids: Tensor | None = None,  # (B, T)
        global_mask: Tensor | None = None,  # (B, T) bool, for the global and bigbird patterns
        return_hidden: bool = False,
        layer_outputs: list | None = None,  # appended: the layers' input and each layer's output (B, T', E)
    ) -> LMOutput:
        """The segment ``input_ids`` after the memory ``mems``: embedded, through the layer stack, scored.  With
        ``return_hidden`` the output holds the hidden states (B, T, E) the softmax scores, and without ``labels``
        the softmax is not run (``self.head(out.hidden)`` scores them)."""
        recurrence = self.config.check_recurrence(recurrence)
        memory = as_memory(mems)
        self._check_inputs(input_ids, memory, labels, global_mask)
        backbone = self.transformer
        step, hidden = backbone.begin(input_ids.long(), memory, recurrence, doc_ids)  # (B, T', E)
        if layer_outputs is not None:
            layer_outputs.append(hidden)
        hidden, memory, aux = backbone.stack.run(
            step, memory, hidden, recurrence, global_mask, layer_outputs, input_ids
        )
        hidden = backbone.end(hidden, layer_outputs)  # (B, T, E)
        if return_hidden and labels is None:
            return LMOutput(loss=None, logits=None, nll=None, mems=memory, aux_loss=aux, hidden=hidden)
        out = self.head(hidden, labels, memory, aux)
        return replace(out, hidden=hidden) if return_hidden else out

    def head(self, hidden: Tensor, labels: Tensor | None = None, mems: Memory | None = None, aux=None) -> LMOutput:
        """The softmax over hidden states (B, T, E): logits (log-probabilities with adaptive softmax), or with
        ``labels`` (B, T) the mean NLL and the per-token NLL (-100 ignored)."""
        c = self.config
        batch, qlen, _ = hidden.shape
        flat = hidden.reshape(batch * qlen, -1)  # (N, E)
        if labels is None:
            scores = self.crit.log_prob(flat) if self.crit.n_clusters else self.crit.logits(flat)
            return LMOutput(loss=None, logits=scores.view(batch, qlen, -1), nll=None, mems=mems, aux_loss=aux)
        labels = labels.reshape(-1).long()
        keep = labels != IGNORE_INDEX
        in_range = (keep.logical_not() | ((labels >= 0) & (labels < c.vocab_size))).all()
        torch._assert_async(in_range, f"labels must lie in [0, {c.vocab_size}) or be {IGNORE_INDEX}")
        nll = self.crit.nll(flat, labels.masked_fill(~keep, 0)).masked_fill(~keep, 0)  # (N,), 0 where ignored
        loss = nll.sum() / keep.sum()  # NaN when no token is labelled (as torch's cross_entropy), never 0
        return LMOutput(loss=loss, logits=None, nll=nll.view(batch, qlen), mems=mems, aux_loss=aux)

    def hidden_states(
        self, input_ids: Tensor, mems: Memory | None = None, **options
    ) -> tuple[Tensor, Memory, Tensor | None]:
        """The backbone alone (``forward``'s keyword options): last-layer hidden states (B, T, E), the new memory
        and the memory's auxiliary loss (or None).  Task heads read documents segment by segment through it."""
        out = self.forward(input_ids, mems, return_hidden=True, **options)
        return out.hidden, out.mems, out.aux_loss

    def read(self, input_ids: Tensor, mems: Memory | None = None, **options) -> Memory:
        """Run a segment through the backbone only and return the new memory (no softmax)."""
        return self.forward(input_ids, mems, return_hidden=True, **options).mems

    def next_token_scores(self, input_ids: Tensor, mems: Memory | None = None, **options) -> tuple[Tensor, Memory]:
        """Scores (B, V) for the token after the last position (logits, or log-probs with adaptive softmax)."""
        out = self.forward(input_ids, mems, return_hidden=True, **options)
        return self.head(out.hidden[:, -1:]).logits[:, -1], out.mems

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied tensors counted once)."""
        return sum(p.numel() for p in self.parameters())
