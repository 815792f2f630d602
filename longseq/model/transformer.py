"""The Transformer-XL backbone and language model (Dai et al., 2019).

Reads top to bottom: feed-forward, decoder layer, backbone, language model.  Tensors are
batch-first; see :mod:`longseq.model.attention` for the dimension glossary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from longseq.config import ModelConfig
from longseq.model.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from longseq.model.attention import RelativeMultiHeadAttention, RelativePositions
from longseq.model.compress import Compressor, reconstruction_loss
from longseq.model.memory import KVMemory, Memory, MemoryState, RingKV, quantize, update_memory
from longseq.model.patterns import PatternMask, global_keys
from longseq.model.positions import relative_distances, sinusoidal_embedding

IGNORE_INDEX = -100


class PositionwiseFF(nn.Module):
    """Linear -> ReLU -> Dropout -> Linear -> Dropout, with residual and pre- or post-LayerNorm."""

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool, eps: float) -> None:
        super().__init__()
        self.pre_lnorm = pre_lnorm
        self.core_net = nn.Sequential(
            nn.Linear(d_model, d_inner),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(d_inner, d_model),
            nn.Dropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, hidden: Tensor) -> Tensor:  # (B, T, E) -> (B, T, E)
        if self.pre_lnorm:
            return hidden + self.core_net(self.layer_norm(hidden))
        return self.layer_norm(hidden + self.core_net(hidden))


class DecoderLayer(nn.Module):
    """Relative multi-head attention over [memory; segment], then the position-wise feed-forward."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.dec_attn = RelativeMultiHeadAttention(
            c.d_model,
            c.n_head,
            c.d_head,
            c.dropout,
            c.dropatt,
            c.pre_lnorm,
            c.layer_norm_eps,
            c.attn_impl,
            c.attn_chunk,
            c.pos,
            c.max_relative_distance,
        )
        self.pos_ff = PositionwiseFF(c.d_model, c.d_inner, c.dropout, c.pre_lnorm, c.layer_norm_eps)

    def forward(self, hidden, rel_key, r_w_bias, r_r_bias, mask, memory=None, cache=None, with_mass=False):
        hidden, present, mass = self.dec_attn(hidden, rel_key, r_w_bias, r_r_bias, mask, memory, cache, with_mass)
        return self.pos_ff(hidden), present, mass


class TransformerXL(nn.Module):
    """Embedding, dropout and the stack of decoder layers; returns hidden states and the new memory.

    u and v (``r_w_bias``, ``r_r_bias``) are (H, D) shared by all layers, or (L, H, D) with ``untie_r``;
    with Shaw et al.'s positions (``pos="shaw"``) there are no u and v (fixed zeros).  Each layer attends
    with its own pattern (``config.layer_patterns()``).

    ``activation_checkpointing`` (an execution setting, not architecture; the training loop sets it from
    ``TrainConfig``) = k recomputes every k-th layer in the backward pass instead of storing its activations.
    """

    activation_checkpointing: int = 0

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.word_emb = AdaptiveEmbedding(c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val)
        self.drop = nn.Dropout(c.dropout)
        bias_shape = (c.n_layer, c.n_head, c.d_head) if c.untie_r else (c.n_head, c.d_head)
        if c.pos in ("shaw", "absolute"):  # Shaw: terms (a) and (b) only; absolute: content only
            self.register_buffer("r_w_bias", torch.zeros(bias_shape), persistent=False)
            self.register_buffer("r_r_bias", torch.zeros(bias_shape), persistent=False)
        else:
            self.r_w_bias = nn.Parameter(torch.zeros(bias_shape))  # u
            self.r_r_bias = nn.Parameter(torch.zeros(bias_shape))  # v
        self.patterns = c.layer_patterns()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_layer))
        if c.cmem_len:
            self.compressors = nn.ModuleList(Compressor(c.cmem_fn, c.cmem_rate, c.d_model) for _ in range(c.n_layer))
        if c.mem_tokens:
            self.memory_tokens = nn.Parameter(torch.zeros(c.mem_tokens, c.d_model))  # the first read tokens

    def _biases(self, layer: int) -> tuple[Tensor, Tensor]:
        if self.config.untie_r:
            return self.r_w_bias[layer], self.r_r_bias[layer]
        return self.r_w_bias, self.r_r_bias

    def _positions(
        self, klen: int, clamp_len: int, dtype: torch.dtype, device: torch.device, rows: int | None = None, qlen=1
    ) -> RelativePositions:
        """The relative positions for distances ``rows - 1`` .. 0 (default: klen .. 0); a bidirectional model
        continues down to -(qlen - 1) for the later keys of the segment.  Every layer projects them itself."""
        rows = klen + 1 if rows is None else rows
        bottom = -(qlen - 1) if self.config.bidirectional else 0
        distances = relative_distances(rows - 1, clamp_len, device, bottom)
        if self.config.pos in ("shaw", "absolute"):
            return RelativePositions(distances, None, dtype)
        exact = torch.float64 if dtype == torch.float64 else torch.float32
        pos_emb = self.drop(sinusoidal_embedding(distances, self.config.d_model, exact).to(dtype))  # (R, E)
        return RelativePositions(distances, pos_emb, dtype)

    def _rel_keys(self, *args, **kwargs) -> list[Tensor | None]:
        """Every layer's relative table (H, R, D), projected outside the layers (arguments as :meth:`_positions`)."""
        positions = self._positions(*args, **kwargs)
        return [layer.dec_attn.relative_keys(positions) for layer in self.layers]

    def _cached_rel_keys(self, mems: KVMemory, klen: int, clamp_len: int, dtype, device, horizon: int):
        """Reuse the W_R R table carried in a key/value memory (eval only: no dropout on R)."""
        table = mems.rel_keys
        if (
            self.training
            or table is None
            or mems.rel_clamp != clamp_len
            or table[0].size(1) < klen + 1
            or table[0].dtype != dtype
        ):
            table = tuple(self._rel_keys(klen, clamp_len, dtype, device, rows=max(klen, horizon) + 1))
        rows = table[0].size(1)
        return table, [t[:, rows - klen - 1 :] for t in table]

    def forward(
        self,
        input_ids: Tensor,
        mems: Memory | MemoryState | KVMemory | None,
        mem_len: int,
        clamp_len: int,
        same_length: bool,
        doc_ids: Tensor | None = None,
        global_mask: Tensor | None = None,
    ) -> tuple[Tensor, Memory | MemoryState | KVMemory, Tensor | None]:
        """Returns hidden states (B, T, E), the new memory and the compressors' reconstruction loss (or None).

        ``global_mask`` (B, T) marks global tokens for the ``global`` and ``bigbird`` patterns."""
        c = self.config
        batch, qlen = input_ids.shape
        n_tok = c.mem_tokens
        qlen += 2 * n_tok  # [read tokens; segment; write tokens]
        kv = isinstance(mems, KVMemory)
        state = mems if isinstance(mems, MemoryState) else None
        if kv:
            mlen = mems.length
        elif state is not None:
            mlen = state.length
        else:
            mlen = 0 if mems is None else mems[0].size(1)
        klen = mlen + qlen
        if same_length and mem_len < 1:
            raise ValueError("same_length=True needs mem_len >= 1: it limits every query to the last mem_len keys")
        span = mem_len + c.cmem_len if same_length else None
        if n_tok and doc_ids is not None:
            raise ValueError("document ids are not supported together with memory tokens")
        if kv and c.bidirectional:
            raise ValueError("a bidirectional model cannot use a KVMemory: every segment token sees the later ones")
        docs = self._documents(doc_ids, state, batch, qlen, mlen, input_ids.device)
        if docs is not None and kv:
            raise ValueError("document resets need the hidden-state memory, not a KVMemory")
        if global_mask is not None and n_tok:
            pad = torch.zeros(batch, n_tok, dtype=torch.bool, device=input_ids.device)
            global_mask = torch.cat([pad, global_mask.to(torch.bool), pad], dim=1)  # memory tokens are not global
        masks = self._masks(qlen, mlen, span, docs, global_mask, batch, input_ids.device)  # one per layer

        hidden = self.word_emb(input_ids)  # (B, T, E)
        if c.pos == "absolute":  # the vanilla Transformer: sinusoidal absolute positions 0 .. T-1
            positions = torch.arange(input_ids.size(1), device=hidden.device, dtype=torch.float32)
            exact = torch.float64 if hidden.dtype == torch.float64 else torch.float32
            hidden = hidden + sinusoidal_embedding(positions, c.d_model, exact).to(hidden.dtype)
        if n_tok:
            read = state.tokens if state is not None and state.tokens is not None else None
            if read is None:
                read = self.memory_tokens.to(hidden.dtype).expand(batch, -1, -1)  # (B, n, E)
            hidden = torch.cat([read, hidden, read], dim=1)  # (B, n + T + n, E)
        hidden = self.drop(hidden)
        if kv:
            table, rel_keys = self._cached_rel_keys(mems, klen, clamp_len, hidden.dtype, hidden.device, mem_len + qlen)
        else:
            positions = self._positions(klen, clamp_len, hidden.dtype, hidden.device, qlen=qlen)
            rel_keys = [positions] * len(self.layers)  # each layer projects them inside its forward
        keep = None
        if self.training and c.mem_dropout > 0 and mlen:
            keep = (torch.rand(batch, mlen, 1, device=hidden.device) >= c.mem_dropout).to(hidden.dtype)  # (B, M, 1)

        if kv and mems.ring:
            rings = mems.rings or tuple(RingKV(mem_len + qlen, mem_len) for _ in range(c.n_layer))
            if rings[0].keys.capacity < rings[0].length + qlen:
                rings = tuple(r.grown(rings[0].length + qlen + mem_len) for r in rings)
        layer_inputs, presents, masses, old_plain = [], [], [], []
        prune = c.mem_select == "attention" and not kv
        empty = hidden.new_zeros(batch, c.n_head, 0, c.d_head)  # (B, H, 0, D)
        for i, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            if kv:
                if mems.ring:
                    cache = rings[i]
                else:
                    cache = (mems.keys[i], mems.values[i]) if mlen else (empty, empty)
                hidden, present, _ = layer(hidden, rel_keys[i], *self._biases(i), masks[i], cache=cache)
                presents.append(present)
                continue
            if state is not None:
                old_plain.append(state.plain(i, hidden.dtype))  # dequantized once, reused for the update
                context = state.context(i, old_plain[-1])
            else:
                context = None if mems is None else mems[i]
            if keep is not None and context is not None:
                context = context * keep  # memory dropout: whole slots
            if self.training and self.activation_checkpointing and i % self.activation_checkpointing == 0:
                hidden, _, mass = checkpoint(
                    layer, hidden, rel_keys[i], *self._biases(i), masks[i], context, None, prune, use_reentrant=False
                )  # activations recomputed in the backward pass; dropout masks replayed exactly
            else:
                hidden, _, mass = layer(
                    hidden, rel_keys[i], *self._biases(i), masks[i], memory=context, with_mass=prune
                )
            masses.append(mass)
        if n_tok:
            written = hidden[:, qlen - n_tok :]  # (B, n, E): the new memory tokens
            hidden = hidden[:, n_tok : qlen - n_tok]
            layer_inputs = [h[:, n_tok : qlen - n_tok] for h in layer_inputs]
        hidden = self.drop(hidden)
        if kv and mems.ring:
            return hidden, KVMemory((), (), table, clamp_len, rings=rings, ring=True), None
        if kv:
            return hidden, KVMemory.from_presents(presents, mem_len, table, clamp_len), None
        if not (c.uses_memory_state or docs is not None):
            return hidden, update_memory(layer_inputs, mems, mem_len), None
        if n_tok and docs is not None:  # the memory keeps segment positions only: drop the tokens' document ids
            query_docs, key_docs = docs
            segment = slice(n_tok, qlen - n_tok)
            docs = (query_docs[:, segment], torch.cat([key_docs[:, :mlen], key_docs[:, mlen:][:, segment]], dim=1))
        old_plain = tuple(old_plain) if state is not None and state.mem_length else None
        new_state, aux = self._update_state(layer_inputs, mems, old_plain, mem_len, docs, masses if prune else None)
        if n_tok:
            age = (state.tokens_age if state is not None else 0) + 1
            if not self.training or age >= c.mem_tokens_bptt:
                written, age = written.detach(), 0
            new_state = MemoryState(new_state.hidden, new_state.compressed, new_state.doc_ids, written, age)
        return hidden, new_state, aux

    def _masks(self, qlen, mlen, span, docs, global_mask, batch, device) -> list[PatternMask]:
        """Each layer's :class:`PatternMask` (layers with the same pattern share one)."""
        query_docs, key_docs = docs if docs is not None else (None, None)
        shared: dict = {}
        masks = []
        for pattern in self.patterns:
            if pattern not in shared:
                flags = None
                if pattern.has_global:
                    flags = global_keys(global_mask, pattern.num_global, batch, qlen, mlen, device)
                shared[pattern] = PatternMask(pattern, qlen, mlen, span, query_docs, key_docs, flags, device)
            masks.append(shared[pattern])
        return masks

    def _documents(self, doc_ids, state, batch, qlen, mlen, device):
        """Document id of every query (B, T) and key (B, K), or None when documents are not tracked."""
        mem_docs = None if state is None else state.doc_ids
        if doc_ids is None and mem_docs is None:
            return None
        if doc_ids is not None and tuple(doc_ids.shape) != (batch, qlen):
            raise ValueError(f"doc_ids must have the input's shape {(batch, qlen)}, got {tuple(doc_ids.shape)}")
        query_docs = (
            doc_ids.long() if doc_ids is not None else torch.zeros(batch, qlen, dtype=torch.long, device=device)
        )
        if mem_docs is None:  # memory without ids continues the segment's first document
            mem_docs = query_docs[:, :1].expand(batch, mlen)
        return query_docs, torch.cat([mem_docs, query_docs], dim=1)

    def _update_state(self, layer_inputs, mems, old_plain, mem_len, docs, masses=None):
        """New :class:`MemoryState`: shift in this segment, compress what falls out, quantize, track documents.

        ``old_plain`` is the dense uncompressed memory the layers just attended to (None for a tuple memory)."""
        c = self.config
        state = mems if isinstance(mems, MemoryState) else MemoryState(hidden=tuple(mems) if mems is not None else ())
        if old_plain is None and state.mem_length:
            old_plain = state.hidden  # a plain tuple memory: already dense
        if masses is not None:
            if docs is not None:
                raise ValueError("mem_select=attention does not support document ids or reset_rows")
            plain = _prune(layer_inputs, old_plain, masses, mem_len, state.cmem_length)
        else:
            plain = update_memory(layer_inputs, old_plain, mem_len)  # (B, M', E) per layer
        n_evicted = (state.mem_length + layer_inputs[0].size(1)) - plain[0].size(1)
        aux = None
        compressed = state.compressed
        if c.cmem_len:
            compressed, aux = self._compress(layer_inputs, old_plain, n_evicted, state)
        hidden = tuple(quantize(h, c.mem_quant_axis) for h in plain) if c.mem_quant == "int8" else plain
        doc_ids = None
        if docs is not None:
            key_docs = docs[1]  # (B, C + M + T) in memory order
            cmem_docs, mem_docs = key_docs[:, : state.cmem_length], key_docs[:, state.cmem_length :]
            evicted_docs, mem_docs = mem_docs[:, :n_evicted], mem_docs[:, n_evicted:]
            if c.cmem_len and n_evicted:
                rate = c.cmem_rate
                group_last = evicted_docs[:, min(rate, n_evicted) - 1 :: rate]  # the newest document of each group
                if group_last.size(1) < compressed[0].size(1) - cmem_docs.size(1):
                    group_last = torch.cat([group_last, evicted_docs[:, -1:]], dim=1)
                cmem_docs = torch.cat([cmem_docs, group_last], dim=1)[:, -c.cmem_len :]
            doc_ids = torch.cat([cmem_docs, mem_docs], dim=1) if c.cmem_len else mem_docs
        return MemoryState(hidden, compressed, doc_ids), aux

    def _compress(self, layer_inputs, old_plain, n_evicted, state):
        c = self.config
        compressed, losses = [], []
        for i, inputs in enumerate(layer_inputs):
            previous = (
                state.compressed[i]
                if state.compressed is not None
                else inputs.new_zeros(inputs.size(0), 0, inputs.size(2))
            )
            if n_evicted == 0:
                compressed.append(previous)
                continue
            joined = inputs if old_plain is None else torch.cat([old_plain[i], inputs], dim=1)
            evicted = joined[:, :n_evicted].detach()  # (B, n, E), oldest first
            squeezed = self.compressors[i](evicted)  # (B, n / rate, E)
            if self.training and self.compressors[i].learned:
                losses.append(reconstruction_loss(self.layers[i].dec_attn, inputs, evicted, squeezed))
            compressed.append(torch.cat([previous, squeezed.detach()], dim=1)[:, -c.cmem_len :])
        aux = torch.stack(losses).mean() if losses else None
        return tuple(compressed), aux


@dataclass
class LMOutput:
    """``loss``: mean NLL over labelled tokens (or None); ``logits``: (B, T, V) logits, or full
    log-probabilities with adaptive softmax (None when labels were given); ``nll``: per-token NLL
    (B, T), 0 where ignored; ``mems``: new memory, one (B, M, E) tensor per layer (a ``MemoryState`` or
    ``KVMemory`` when those are in use); ``aux_loss``: the compressors' attention-reconstruction loss
    in training with a learned compressed memory (add it to the loss), else None."""

    loss: Tensor | None
    logits: Tensor | None
    nll: Tensor | None
    mems: Memory | MemoryState | KVMemory
    aux_loss: Tensor | None = None


class TransformerXLLM(nn.Module):
    """Transformer-XL language model: ``model(input_ids, mems=None, labels=None) -> LMOutput``.

    ``labels[b, t]`` is the target of position t (the next token of the stream); -100 is ignored.
    ``mem_len``, ``clamp_len`` and ``same_length`` may be overridden per call, e.g. for evaluation
    with a longer memory than in training.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.transformer = TransformerXL(c)
        self.crit = AdaptiveLogSoftmax(c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val)
        self.init_weights()
        self.tie_weights()

    def init_weights(self) -> None:
        """The paper's initialisation.

        * Linear, embedding and softmax weights, u and v: normal(0, ``init_std`` = 0.02); biases 0.
        * Embedding and softmax projections (``emb_projs``, ``out_projs``): normal(0, ``proj_init_std`` = 0.01).
        * LayerNorm weights normal(1, ``init_std``), biases 0.
        * Cluster weights of the adaptive softmax normal(0, ``init_std``), cluster biases 0.
        """
        std, proj_std = self.config.init_std, self.config.proj_init_std
        for name, param in self.named_parameters():
            if "emb_projs" in name or "out_projs" in name:
                nn.init.normal_(param, 0.0, proj_std)
            elif "layer_norm.weight" in name:
                nn.init.normal_(param, 1.0, std)
            elif name.endswith("bias") and "r_w_bias" not in name and "r_r_bias" not in name:
                nn.init.zeros_(param)
            else:
                nn.init.normal_(param, 0.0, std)

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

    def _check_inputs(self, input_ids: Tensor, mems: Memory | KVMemory | None, labels: Tensor | None) -> None:
        c = self.config
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a (batch, time) tensor, got shape {shape}")
        if input_ids.dtype not in (torch.int64, torch.int32) or input_ids.numel() == 0:
            raise ValueError(
                f"input_ids must be a non-empty integer tensor, got {input_ids.dtype} {tuple(input_ids.shape)}"
            )
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= c.vocab_size:
            raise ValueError(f"token ids must lie in [0, {c.vocab_size}), got values in [{low}, {high}]")
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
        if isinstance(mems, KVMemory):
            if mems.rings is not None:
                if mems.rings[0].keys.storage.size(0) != input_ids.size(0):
                    raise ValueError(
                        f"KVMemory must hold {c.n_layer} key and value tensors of batch {input_ids.size(0)}"
                    )
            elif mems.length:
                want = (input_ids.size(0), c.n_head, mems.length, c.d_head)
                if len(mems.keys) != c.n_layer or any(tuple(k.shape) != want for k in mems.keys + mems.values):
                    raise ValueError(
                        f"KVMemory must hold {c.n_layer} key and value tensors of shape (B, H, M, D) = {want}"
                    )
        elif isinstance(mems, MemoryState):
            if mems.hidden and (len(mems.hidden) != c.n_layer or mems.hidden[0].size(0) != input_ids.size(0)):
                raise ValueError(f"MemoryState must hold {c.n_layer} layers of batch {input_ids.size(0)}")
        elif mems is not None:
            if len(mems) != c.n_layer:
                raise ValueError(f"mems must hold one tensor per layer ({c.n_layer}), got {len(mems)}")
            want = (input_ids.size(0), mems[0].size(1) if mems[0].dim() == 3 else -1, c.d_model)
            for i, mem in enumerate(mems):
                if mem.dim() != 3 or tuple(mem.shape) != want:
                    raise ValueError(
                        f"mems[{i}] must have shape (batch, mem_len, d_model) = {want}, got {tuple(mem.shape)}"
                    )

    def forward(
        self,
        input_ids: Tensor,  # (B, T)
        mems: Memory | None = None,
        labels: Tensor | None = None,  # (B, T)
        *,
        mem_len: int | None = None,
        clamp_len: int | None = None,
        same_length: bool | None = None,
        doc_ids: Tensor | None = None,  # (B, T)
        global_mask: Tensor | None = None,  # (B, T) bool, for the global and bigbird patterns
    ) -> LMOutput:
        c = self.config
        hidden, new_mems, aux = self._recur(
            input_ids, mems, mem_len, clamp_len, same_length, labels, doc_ids, global_mask
        )
        # hidden: (B, T, E)
        batch, qlen, _ = hidden.shape
        flat = hidden.reshape(batch * qlen, -1)  # (N, E)
        if labels is None:
            scores = self.crit.log_prob(flat) if self.crit.n_clusters else self.crit.logits(flat)
            return LMOutput(loss=None, logits=scores.view(batch, qlen, -1), nll=None, mems=new_mems, aux_loss=aux)
        labels = labels.reshape(-1).long()
        keep = labels != IGNORE_INDEX
        kept = labels[keep]
        if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= c.vocab_size):
            raise ValueError(f"labels must lie in [0, {c.vocab_size}) or be {IGNORE_INDEX}")
        if bool(keep.all()):
            nll = self.crit.nll(flat, labels)  # (N,)
        else:
            index = keep.nonzero().squeeze(1)
            picked = self.crit.nll(flat[index], kept)
            nll = picked.new_zeros(labels.shape).index_copy(0, index, picked)  # (N,), 0 where ignored
        count = keep.sum()
        loss = nll.sum() / count.clamp(min=1)
        return LMOutput(loss=loss, logits=None, nll=nll.view(batch, qlen), mems=new_mems, aux_loss=aux)

    def _recur(self, input_ids, mems, mem_len, clamp_len, same_length, labels=None, doc_ids=None, global_mask=None):
        c = self.config
        self._check_inputs(input_ids, mems, labels)
        if global_mask is not None:
            if not any(p.has_global for p in self.transformer.patterns):
                raise ValueError(
                    f"global_mask needs a global or bigbird attention pattern, the model has {c.attention}"
                )
            if not isinstance(global_mask, Tensor) or global_mask.shape != input_ids.shape:
                shape = tuple(global_mask.shape) if isinstance(global_mask, Tensor) else type(global_mask).__name__
                raise ValueError(f"global_mask must have the input's shape {tuple(input_ids.shape)}, got {shape}")
        return self.transformer(
            input_ids.long(),
            mems,
            c.mem_len if mem_len is None else mem_len,
            c.clamp_len if clamp_len is None else clamp_len,
            c.same_length if same_length is None else same_length,
            doc_ids,
            global_mask,
        )

    def read(self, input_ids: Tensor, mems: Memory | KVMemory | None = None, **overrides) -> Memory | KVMemory:
        """Run a segment through the backbone only and return the new memory (no softmax)."""
        return self._recur(input_ids, mems, **_overrides(overrides))[1]

    def next_token_scores(
        self, input_ids: Tensor, mems: Memory | KVMemory | None = None, **overrides
    ) -> tuple[Tensor, Memory | KVMemory]:
        """Scores (B, V) for the token after the last position (logits, or log-probs with adaptive softmax)."""
        hidden, new_mems, _ = self._recur(input_ids, mems, **_overrides(overrides))
        last = hidden[:, -1]  # (B, E)
        scores = self.crit.log_prob(last) if self.crit.n_clusters else self.crit.logits(last)
        return scores, new_mems

    @classmethod
    def from_hf(cls, path: str) -> TransformerXLLM:
        """Load a Hugging Face TransfoXL checkpoint directory (the reading lives in :mod:`longseq.interop.hf`)."""
        from longseq.interop.hf import load_hf

        return load_hf(path)

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied tensors counted once)."""
        return sum(p.numel() for p in self.parameters())


def _overrides(overrides: dict) -> dict:
    unknown = set(overrides) - {"mem_len", "clamp_len", "same_length"}
    if unknown:
        raise TypeError(f"unknown recurrence override(s) {sorted(unknown)}; use mem_len, clamp_len or same_length")
    return {k: overrides.get(k) for k in ("mem_len", "clamp_len", "same_length")}


def _prune(layer_inputs, old_plain, masses, mem_len: int, cmem_length: int):
    """Keep this segment, and of the old memory the slots that received the most attention mass.

    The kept slots stay in their original order; as with compressed memory, relative positions then
    count slots, not tokens.  Per layer, since each layer attends with its own weights.
    """
    with torch.no_grad():
        new = []
        for i, inputs in enumerate(layer_inputs):
            qlen = inputs.size(1)
            old = None if old_plain is None else old_plain[i]
            room = mem_len - qlen
            if old is None or old.size(1) == 0 or room <= 0:
                new.append(update_memory([inputs], None if old is None else (old,), mem_len)[0])
                continue
            if old.size(1) <= room:
                new.append(torch.cat([old, inputs], dim=1).detach())
                continue
            mass = masses[i][:, cmem_length : cmem_length + old.size(1)]  # (B, M) mass of the old plain slots
            keep = mass.topk(room, dim=1).indices.sort(dim=1).values  # (B, room), chronological
            kept = old.gather(1, keep[:, :, None].expand(-1, -1, old.size(2)))
            new.append(torch.cat([kept, inputs], dim=1).detach())
        return tuple(new)
