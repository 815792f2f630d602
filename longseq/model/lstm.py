"""An LSTM language model baseline in the same harness (same data, tokenizer, loop, checkpoints, CLI).

Embedding -> dropout -> ``n_layer`` LSTM layers of width ``d_model`` -> dropout -> softmax tied to the
embedding (``tie_weight``).  Its "memory" is the recurrent state carried across segments (truncated BPTT),
one (h, c) state per layer, (B, E) each, in a :class:`~longseq.model.memory.Memory`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.config.model import ModelConfig, Recurrence
from longseq.model.memory import Memory, RecurrentState
from longseq.model.transformer import IGNORE_INDEX, LMOutput


class LSTMLM(nn.Module):
    """``model(input_ids, mems=None, labels=None) -> LMOutput``, the interface of the Transformer-XL LM.

    The transformer's per-call ``recurrence`` is accepted, checked as the transformer checks it, and has no effect: an LSTM's context is its whole past.
    ``doc_ids`` is accepted and refused unless None (it keeps no documents apart); what the transformer's layers
    alone read (``global_mask``, ``layer_outputs``) and any other keyword is a ``TypeError`` naming it."""

    reads = ("n_layer", "d_model", "dropout", "tie_weight", "init_std")  # the model options an LSTM has use for

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.lstm = nn.LSTM(
            c.d_model, c.d_model, num_layers=c.n_layer, batch_first=True, dropout=c.dropout * (c.n_layer > 1)
        )
        self.decoder = nn.Linear(c.d_model, c.vocab_size)
        self.init_weights()
        if c.tie_weight:
            self.decoder.weight = self.embedding.weight

    def init_weights(self) -> None:
        """Embedding and decoder normal(0, ``init_std``); LSTM weights uniform(+-1/sqrt(E)) (PyTorch's default);
        biases 0 except the forget gates' 1."""
        nn.init.normal_(self.embedding.weight, 0.0, self.config.init_std)
        nn.init.normal_(self.decoder.weight, 0.0, self.config.init_std)
        nn.init.zeros_(self.decoder.bias)
        self.lstm.reset_parameters()
        width = self.config.d_model
        for name, param in self.lstm.named_parameters():
            if name.startswith("bias"):
                with torch.no_grad():
                    param.zero_()
                    param[width : 2 * width].fill_(0.5)  # b_ih + b_hh: forget-gate bias 1 in total

    def forward(
        self,
        input_ids: Tensor,
        mems=None,
        labels: Tensor | None = None,
        *,
        recurrence: Recurrence | None = None,  # accepted and checked; no effect (as the shorthand below)
        doc_ids: Tensor | None = None,  # None only
        return_hidden: bool = False,
    ) -> LMOutput:  # (B, T) -> LMOutput
        self._check_options(recurrence, doc_ids)
        output, new_mems = self._recur(input_ids, mems)
        hidden = self.drop(output)  # (B, T, E)
        if return_hidden and labels is None:
            return LMOutput(loss=None, logits=None, nll=None, mems=new_mems, hidden=hidden)
        logits = self.decoder(hidden)  # (B, T, V)
        kept = hidden if return_hidden else None
        if labels is None:
            return LMOutput(loss=None, logits=logits, nll=None, mems=new_mems)
        flat = labels.reshape(-1).long()
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), flat, ignore_index=IGNORE_INDEX, reduction="none")
        count = (flat != IGNORE_INDEX).sum().clamp(min=1)
        return LMOutput(loss=nll.sum() / count, logits=None, nll=nll.view_as(labels), mems=new_mems, hidden=kept)

    def read(self, input_ids: Tensor, mems: Memory | None = None, *, recurrence=None, doc_ids=None) -> Memory:
        """Run a segment through the LSTM only and return the new state (no softmax), as the transformer's; the
        keywords are :meth:`forward`'s."""
        self._check_options(recurrence, doc_ids)
        return self._recur(input_ids, mems)[1]

    def next_token_scores(
        self, input_ids: Tensor, mems: Memory | None = None, *, recurrence=None, doc_ids=None
    ) -> tuple[Tensor, Memory]:
        """Logits (B, V) for the token after the last position, and the new state (for generation); the keywords
        are :meth:`forward`'s."""
        self._check_options(recurrence, doc_ids)
        output, new_mems = self._recur(input_ids, mems)
        return self.decoder(self.drop(output[:, -1])), new_mems

    def _check_options(self, recurrence, doc_ids) -> None:
        """The transformer's per-call options: a recurrence is checked as the transformer checks it (a
        ``Recurrence``) and has no effect; documents are refused."""
        self.config.check_recurrence(recurrence)
        if doc_ids is not None:
            raise ValueError("the LSTM baseline does not keep documents apart (doc_reset); use a transformer")

    def _recur(self, input_ids: Tensor, mems: Memory | None) -> tuple[Tensor, Memory]:
        """The top layer's outputs (B, T, E) and the new (h, c) state of every layer."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a (batch, time) tensor, got shape {tuple(input_ids.shape)}")
        batch = input_ids.size(0)
        state = None
        if mems is not None and len(mems.layers):  # a Memory: the (h, c) state of every layer, (B, E) each
            stacked = torch.stack([torch.stack(layer.tensors, dim=1) for layer in mems.layers], dim=0)  # (L, B, 2, E)
            if stacked.shape != (self.config.n_layer, batch, 2, self.config.d_model):
                raise ValueError(
                    f"LSTM state must be {self.config.n_layer} tensors of shape {(batch, 2, self.config.d_model)}"
                )
            state = (stacked[:, :, 0].contiguous(), stacked[:, :, 1].contiguous())
        hidden = self.drop(self.embedding(input_ids.long()))  # (B, T, E)
        output, (h, c) = self.lstm(hidden, state)
        return output, Memory(tuple(RecurrentState((h[i].detach(), c[i].detach())) for i in range(len(h))))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
