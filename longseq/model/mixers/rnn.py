"""The ``rnn`` mixer: one LSTM layer (B, T, E) -> (B, T, E) whose (h, c) is carried like the XL memory, so the RNN
comparison can be made layer for layer.  A document boundary resets (h, c) to zero at that position."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def lstm_reference(layer: nn.LSTM, x: Tensor, state: tuple | None, docs=None) -> tuple[Tensor, tuple]:
    """The LSTM written out gate by gate, one position at a time (the readable reference)."""
    batch, length, width = x.shape
    h = x.new_zeros(batch, width) if state is None else state[0]
    c = x.new_zeros(batch, width) if state is None else state[1]
    out = []
    for t in range(length):
        if docs is not None:
            previous = docs[1] if t == 0 else docs[0][:, t - 1]
            keep = (docs[0][:, t] == previous).to(x.dtype)[:, None]
            h, c = h * keep, c * keep
        gates = x[:, t] @ layer.weight_ih_l0.T + layer.bias_ih_l0 + h @ layer.weight_hh_l0.T + layer.bias_hh_l0
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        out.append(h)
    return torch.stack(out, dim=1), (h, c)


class LSTMMixer(nn.Module):
    """State ``(h, c)``, each (B, E)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d_model, d_model, batch_first=True)

    def init_own_parameters(self) -> None:
        """PyTorch's LSTM initialisation, uniform(-1 / sqrt(E), 1 / sqrt(E)) for weights and biases, as the
        ``arch=lstm`` baseline has."""
        self.lstm.reset_parameters()

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of h and c without the batch: (E,) each."""
        return ((self.lstm.hidden_size,), (self.lstm.hidden_size,))

    def forward(self, hidden: Tensor, state: tuple | None, docs=None) -> tuple[Tensor, tuple]:
        batch, length, width = hidden.shape
        h0 = hidden.new_zeros(1, batch, width) if state is None else state[0][None].to(hidden.dtype)
        c0 = hidden.new_zeros(1, batch, width) if state is None else state[1][None].to(hidden.dtype)
        if docs is None:
            out, (h, c) = self.lstm(hidden, (h0.contiguous(), c0.contiguous()))
            return out, (h[0], c[0])
        previous = torch.cat([docs[1][:, None], docs[0][:, :-1]], dim=1)
        starts = docs[0] != previous  # (B, T): positions that begin a document
        pieces, (h, c) = [], (h0, c0)
        cuts = [0, *sorted({int(t) for t in starts.nonzero()[:, 1].tolist()} - {0}), length]
        for lo, hi in zip(cuts, cuts[1:]):  # runs without a boundary inside; resets at their first position
            keep = (~starts[:, lo]).to(hidden.dtype)[None, :, None]
            out, (h, c) = self.lstm(hidden[:, lo:hi], ((h * keep).contiguous(), (c * keep).contiguous()))
            pieces.append(out)
        return torch.cat(pieces, dim=1), (h[0], c[0])
