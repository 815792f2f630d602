"""The linear-attention family: mixers whose state is one matrix per head, (B, H, K, V), carried across segments
like the XL memory (stop-gradient between segments, reset by documents, saved in checkpoints).

    q, k, v = W_q h, W_k h, W_v h                         ``n_head`` heads of ``d_head`` channels, as attention's
    S_t = diag(exp(g_t)) S_{t-1} + phi(k_t) v_t^T          o_t = S_t^T phi(q_t)      (:mod:`.linear_scan`)
    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T     o_t = S_t^T q_t           (:mod:`.delta_rule`)
    out = W_o output(o)

* ``linear`` (Katharopoulos et al., 2020): phi = elu + 1, no decay, o_t / (phi(q_t) . sum_s phi(k_s)).
* ``performer`` (Choromanski et al., 2021): FAVOR+, phi(x) = exp(W x - |x|^2 / 2) / sqrt(m) with x = q / d^(1/4)
  and m = ``features`` positive orthogonal random features W (drawn when the layer is built, from the run's seed,
  and kept as a buffer, so a checkpoint holds it), normalised like ``linear``.

  Neither forgets: carried over a stream, the state sums everything read since its start, each position's output
  is an average over all of it, and the weight of the last few positions falls as 1 / (positions read).  On
  character PTB the unbounded ``linear`` stack learnt no more than the bigram (3.4467 bpc at 3,000 steps, the
  corpus's bigram 3.4390).  So their state restarts every ``reset_every`` positions (counted from the stream's or
  the document's start; 0: never), as the papers' models start each training sequence empty and as TransNormer's
  block-diagonal attention (Qin et al., 2022) bounds the dilution; and with ``rotary`` the numerator's features are
  rotated by their position (RoFormer's linear attention, Su et al., 2021, eq. 19; the denominator unrotated, so
  it stays positive), which gives the layer the order that no other part of a stack without attention has::

      o_t = sum_s (R_t phi(q_t)) . (R_s phi(k_s)) v_s / sum_s phi(q_t) . phi(k_s)      s <= t, in t's block
* ``retention`` (RetNet, Sun et al., 2023): q and k rotated by their position (theta_i = 10000^(-2i/d)), q / sqrt(d),
  a fixed decay gamma_h = 1 - 2^(-5 - h) per head; output swish(W_g h) * RMSNorm(o) per head.
* ``gla`` (gated linear attention, Yang et al., 2024): q / sqrt(d), a data-dependent decay per key channel,
  g_t = logsigmoid(W_2 W_1 h_t + b) / 16 (W_1 of rank 16); output swish(W_g h) * RMSNorm(o).
* ``delta`` (DeltaNet, Schlag et al., 2021; Yang et al., 2024): q and k l2-normalised after silu (with the short
  convolution below, its silu, on v too), q / sqrt(d), beta_t = sigmoid(W_b h_t) per head; output RMSNorm(o).

A mixer named in ``mixers.short_conv`` (by default ``delta``, as fla's DeltaNet) passes q, k and v through a causal
depthwise convolution of ``conv_kernel`` taps without bias, then a silu (fla's ShortConvolution), before its feature
map; the convolution's tail (B, kernel - 1, 3 H D) is the state's last tensor, masked at document starts as the
``conv`` mixer's (:func:`~longseq.model.mixers.conv.causal_conv`).

The normalised mixers carry the normaliser sum_s phi(k_s) as one more value column: their state is
(B, H, K, V + 1), and, with ``reset_every`` or ``rotary``, the next position's count (B,) int64.  Retention also
carries its next position (B,) for the rotation (relative, so it need not reset).
``form`` chooses the scan when the layer is built: ``chunked`` (the default; a segment of at most 4 positions, as in
generation, runs the recurrence), ``recurrent``, or ``quadratic`` (the readable reference).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.model.mixers.conv import causal_conv
from longseq.model.mixers.delta_rule import delta_chunked, delta_quadratic, delta_recurrent
from longseq.model.mixers.linear_scan import scan_chunked, scan_quadratic, scan_recurrent

FORMS = ("chunked", "recurrent", "quadratic")
SHORT = 4  # a segment this short (generation) runs the recurrence


def document_starts(docs) -> Tensor | None:
    """(B, T) True where a position begins a document, from the stack's (documents (B, T), last document (B,))."""
    if docs is None:
        return None
    previous = torch.cat([docs[1][:, None], docs[0][:, :-1]], dim=1)
    return docs[0] != previous


def rotate(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """x (B, T, H, D) rotated by angle position * theta_i in each pair (i, i + D/2), theta_i = base^(-2i/D); the
    angles in float64, so a position in the millions keeps its phase."""
    half = x.size(-1) // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angle = positions.to(torch.float64)[..., None] * theta  # (B, T, D/2)
    cos, sin = (f(angle).to(x.dtype)[:, :, None] for f in (torch.cos, torch.sin))  # (B, T, 1, D/2)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MatrixMixer(nn.Module):
    """(B, T, E) -> (B, T, E) with a matrix state per head.  A variant overrides :meth:`mix` (feature maps, decay,
    which scan) and, if it has one, :meth:`output`.  ``conv_kernel`` > 0: the short convolution of q, k and v."""

    def __init__(self, d_model: int, heads: int, d_head: int, chunk: int, conv_kernel: int = 0) -> None:
        super().__init__()
        self.heads, self.d_head, self.chunk = heads, d_head, chunk
        self.qkv = nn.Linear(d_model, 3 * heads * d_head, bias=False)  # W_q, W_k, W_v
        self.out_proj = nn.Linear(heads * d_head, d_model, bias=False)  # W_o
        self.conv_weight = nn.Parameter(torch.zeros(3 * heads * d_head, conv_kernel)) if conv_kernel else None
        self.form = "chunked"

    def init_own_parameters(self) -> None:
        """PyTorch's default for every projection and a unit scale for every norm: with the model's
        normal(0, 0.02) a product of two projections (keys and values, a gate) all but silences the layer."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.RMSNorm)):
                    module.reset_parameters()
            if self.conv_weight is not None:  # nn.Conv1d's default, as fla's ShortConvolution: fan-in = kernel
                bound = self.conv_weight.size(1) ** -0.5
                self.conv_weight.uniform_(-bound, bound)

    def forward(self, hidden: Tensor, state: tuple | None, docs=None) -> tuple[Tensor, tuple]:
        batch, length, _ = hidden.shape
        qkv, tail = self.qkv(hidden), None  # (B, T, 3 H D)
        if self.conv_weight is not None:  # the tail is the state's last tensor
            tail, state = (None, None) if state is None else (state[-1], state[:-1])
            qkv, tail = causal_conv(qkv, self.conv_weight, None, tail, docs)
            qkv = F.silu(qkv)
        q, k, v = qkv.view(batch, length, 3, self.heads, self.d_head).unbind(2)  # (B, T, H, D) each
        o, state = self.mix(hidden, q, k, v, state, document_starts(docs))  # (B, T, H, V)
        out = self.out_proj(self.output(hidden, o).reshape(batch, length, -1))
        return out, state if tail is None else (*state, tail)

    def mix(self, hidden: Tensor, q: Tensor, k: Tensor, v: Tensor, state: tuple | None, starts) -> tuple:
        """The outputs (B, T, H, V) and the new state tuple."""
        raise NotImplementedError

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of the state's tensors without the batch: :meth:`mix`'s, then the convolution's tail."""
        tail = () if self.conv_weight is None else ((self.conv_weight.size(1) - 1, self.conv_weight.size(0)),)
        return (*self.mix_shapes(), *tail)

    def mix_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of :meth:`mix`'s state without the batch: one matrix (H, D, D) unless a variant says."""
        return ((self.heads, self.d_head, self.d_head),)

    def output(self, hidden: Tensor, o: Tensor) -> Tensor:
        return o

    def scan(self, q, k, v, g, state, starts):
        """The decayed outer-product scan in this layer's form."""
        if self.form == "quadratic":
            return scan_quadratic(q, k, v, g, state, starts)
        if self.form == "recurrent" or q.size(1) <= SHORT:
            return scan_recurrent(q, k, v, g, state, starts)
        return scan_chunked(q, k, v, g, self.chunk, state, starts)

    def normalised(self, q, k, v, state, starts, positions: Tensor | None = None, eps: float = 1e-6):
        """Katharopoulos's o_t = sum_s (q_t . k_s) v_s / sum_s q_t . k_s: the denominator from a column of ones.
        With ``positions`` (B, T), the numerator's q and k rotated by them (RoFormer's form); the state's first V
        columns then hold the rotated sum, its last the unrotated normaliser, as without."""
        ones = v.new_ones(*v.shape[:-1], 1)
        if positions is None:
            o, s = self.scan(q, k, torch.cat([v, ones], dim=-1), None, state, starts)  # (B, T, H, V + 1)
            return o[..., :-1] / (o[..., -1:] + eps), s
        values, normaliser = (None, None) if state is None else (state[..., :-1], state[..., -1:])
        o, s = self.scan(rotate(q, positions), rotate(k, positions), v, None, values, starts)  # (B, T, H, V)
        z, n = self.scan(q, k, ones, None, normaliser, starts)  # (B, T, H, 1)
        return o / (z + eps), torch.cat([s, n], dim=-1)


def positions_since_start(first: Tensor, starts: Tensor | None, length: int) -> Tensor:
    """(B, T) each position's count from its document's start: ``first`` (B,) + t, or t - (its last start)."""
    index = torch.arange(length, device=first.device)
    if starts is None:
        return first[:, None] + index
    last = torch.where(starts, index, -1).cummax(dim=1).values  # (B, T): the last start at or before t, or -1
    return torch.where(last >= 0, index - last, first[:, None] + index)


class Unforgetting(MatrixMixer):
    """A normalised mixer without decay (``linear``, ``performer``): a variant gives its :meth:`features`; the
    state restarts every ``reset_every`` positions (0: never) and, with ``rotary``, the numerator is rotated.
    State (S,) with S (B, H, K, V + 1), or (S, next position) with either option (and the short convolution's
    tail last, where it has one)."""

    def __init__(self, d_model: int, heads: int, d_head: int, chunk: int, reset_every: int, rotary: bool,
                 conv_kernel: int = 0) -> None:  # fmt: skip
        super().__init__(d_model, heads, d_head, chunk, conv_kernel)
        self.reset_every, self.rotary = reset_every, rotary

    def features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """phi(q), phi(k): (B, T, H, K) each, positive."""
        raise NotImplementedError

    def mix_shapes(self) -> tuple[tuple[int, ...], ...]:
        position = ((),) if self.reset_every or self.rotary else ()  # the next position (B,)
        return ((self.heads, self.feature_size(), self.d_head + 1), *position)

    def feature_size(self) -> int:
        """K, the size of phi(q)."""
        return self.d_head

    def mix(self, hidden, q, k, v, state, starts):
        q, k = self.features(q, k)
        if not (self.reset_every or self.rotary):
            o, s = self.normalised(q, k, v, None if state is None else state[0], starts)
            return o, (s,)
        first = q.new_zeros(q.size(0), dtype=torch.long) if state is None else state[1]
        positions = positions_since_start(first, starts, q.size(1))  # (B, T)
        if self.reset_every:
            block = positions % self.reset_every == 0  # the state restarts here
            starts = block if starts is None else starts | block
        rotated = positions if self.rotary else None
        o, s = self.normalised(q, k, v, None if state is None else state[0], starts, rotated)
        return o, (s, positions[:, -1] + 1)


class LinearAttention(Unforgetting):
    """``linear``: phi = elu + 1; S (B, H, D, D + 1)."""

    def features(self, q, k):
        return F.elu(q) + 1, F.elu(k) + 1


def orthogonal_features(m: int, d: int) -> Tensor:
    """(m, d) random features: blocks of d orthogonal rows, each row given the length of a Gaussian vector (chi with
    d degrees of freedom), as FAVOR+ draws them.  Uses torch's global generator.

    Each block is the Q of a Gaussian matrix's QR with R's diagonal made positive: without that correction
    LAPACK's Q is not a uniformly random rotation (each column's first entry has one sign) and the features are
    biased."""
    q, r = torch.linalg.qr(torch.randn(math.ceil(m / d), d, d))  # (n, d, d)
    rows = (q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]).transpose(-1, -2).reshape(-1, d)
    return rows[:m] * torch.randn(m, d).norm(dim=1, keepdim=True)


def favor_features(x: Tensor, projection: Tensor, stabilise: bool) -> Tensor:
    """phi(x) = exp(W x - |x|^2 / 2) / sqrt(m) of x (B, T, H, D) with W (m, D): (B, T, H, m), positive.
    ``stabilise`` subtracts each position's largest exponent (for queries: it cancels in the normalised output)."""
    exponent = x @ projection.T - (x * x).sum(-1, keepdim=True) / 2
    if stabilise:
        exponent = exponent - exponent.amax(dim=-1, keepdim=True).detach()
    return exponent.exp() / math.sqrt(projection.size(0))


class Performer(Unforgetting):
    """``performer``: FAVOR+ (see the module docstring); S (B, H, m, D + 1)."""

    def __init__(self, d_model: int, heads: int, d_head: int, chunk: int, reset_every: int, rotary: bool,
                 features: int, conv_kernel: int = 0) -> None:  # fmt: skip
        super().__init__(d_model, heads, d_head, chunk, reset_every, rotary, conv_kernel)
        self.register_buffer("projection", orthogonal_features(features, d_head))  # (m, D), saved, not trained

    def feature_size(self) -> int:
        return self.projection.size(0)

    def features(self, q, k):
        scale = self.d_head**-0.25  # q . k / sqrt(d) = (q / d^(1/4)) . (k / d^(1/4))
        q = favor_features(q * scale, self.projection, stabilise=True)
        return q, favor_features(k * scale, self.projection, stabilise=False)  # k's bounded by exp(|w|^2 / 2)


class GatedOutput(MatrixMixer):
    """A mixer whose output is swish(W_g h) * RMSNorm(o), the norm per head (RetNet's and GLA's)."""

    def __init__(self, d_model: int, heads: int, d_head: int, chunk: int, conv_kernel: int = 0) -> None:
        super().__init__(d_model, heads, d_head, chunk, conv_kernel)
        self.gate = nn.Linear(d_model, heads * d_head, bias=False)
        self.norm = nn.RMSNorm(d_head, eps=1e-5)

    def output(self, hidden, o):
        return self.norm(o) * F.silu(self.gate(hidden)).view_as(o)


class Retention(GatedOutput):
    """``retention``: state (S, next position) with S (B, H, D, D), the position (B,) int64 (with a short
    convolution, its tail last)."""

    def log_gamma(self, like: Tensor) -> Tensor:
        """log gamma_h (H,), in ``like``'s dtype and device (rounded through float32, as it always was).  Made
        here, not held in a buffer: a buffer that is not saved is left uninitialised by transformers'
        ``from_pretrained``, and a saved one would be a checkpoint entry that never changes."""
        gammas = 1 - 2.0 ** (-5.0 - torch.arange(self.heads, dtype=torch.float64, device=like.device))
        return gammas.log().float().to(like.dtype)

    def mix_shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((self.heads, self.d_head, self.d_head), ())  # S and the next position (B,)

    def mix(self, hidden, q, k, v, state, starts):
        batch, length = q.shape[:2]
        start = q.new_zeros(batch, dtype=torch.long) if state is None else state[1]
        positions = start[:, None] + torch.arange(length, device=q.device)  # (B, T)
        q, k = rotate(q, positions) * self.d_head**-0.5, rotate(k, positions)
        g = self.log_gamma(q).expand(batch, length, self.heads)  # (B, T, H)
        o, s = self.scan(q, k, v, g, None if state is None else state[0], starts)
        return o, (s, start + length)


class GatedLinearAttention(GatedOutput):
    """``gla``: state (S,) with S (B, H, D, D) (with a short convolution, (S, tail)); the decay per key channel."""

    rank, normaliser = 16, 16.0  # GLA's low-rank gate and its logit normaliser

    def __init__(self, d_model: int, heads: int, d_head: int, chunk: int, conv_kernel: int = 0) -> None:
        super().__init__(d_model, heads, d_head, chunk, conv_kernel)
        self.decay = nn.Sequential(nn.Linear(d_model, self.rank, bias=False), nn.Linear(self.rank, heads * d_head))

    def mix(self, hidden, q, k, v, state, starts):
        g = (F.logsigmoid(self.decay(hidden)) / self.normaliser).view_as(k)  # (B, T, H, D), <= 0
        o, s = self.scan(q * self.d_head**-0.5, k, v, g, None if state is None else state[0], starts)
        return o, (s,)


class DeltaNet(MatrixMixer):
    """``delta``: state (S, tail) with S (B, H, D, D), written by the delta rule, and the short convolution's tail
    (B, kernel - 1, 3 H D); (S,) with ``short_conv`` not naming it."""

    def __init__(self, d_model: int, heads: int, d_head: int, chunk: int, conv_kernel: int = 0) -> None:
        super().__init__(d_model, heads, d_head, chunk, conv_kernel)
        self.beta = nn.Linear(d_model, heads, bias=False)
        self.norm = nn.RMSNorm(d_head, eps=1e-5)

    def mix(self, hidden, q, k, v, state, starts):
        if self.conv_weight is None:  # with the short convolution, its silu (on v too, as fla's)
            q, k = F.silu(q), F.silu(k)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        q, beta, s = q * self.d_head**-0.5, torch.sigmoid(self.beta(hidden)), None if state is None else state[0]
        if self.form == "quadratic":
            o, s = delta_quadratic(q, k, v, beta, s, starts)
        elif self.form == "recurrent" or q.size(1) <= SHORT:
            o, s = delta_recurrent(q, k, v, beta, s, starts)
        else:
            o, s = delta_chunked(q, k, v, beta, self.chunk, s, starts)
        return o, (s,)

    def output(self, hidden, o):
        return self.norm(o)
