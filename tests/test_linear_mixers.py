"""The linear-attention family (linear, performer, retention, gla, delta): every form of each scan equals the others
in float64 at 1e-10, gradients included; chunked with the state carried equals the whole sequence; document
starts reset the state."""

import pytest
import torch

from longseq.model.mixers.delta_rule import delta_chunked, delta_quadratic, delta_recurrent
from longseq.model.mixers.linear_scan import scan_chunked, scan_quadratic, scan_recurrent

B, T, H, K, V = 2, 13, 3, 4, 5


def grads(outputs, tensors):
    loss = sum((o.double() * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o)).sum() for o in outputs)
    return torch.autograd.grad(loss, tensors, retain_graph=True)


def leaf(*shape, positive=False):
    x = torch.rand(*shape, dtype=torch.float64) if positive else torch.randn(*shape, dtype=torch.float64)
    return x.requires_grad_()


def starts_for(length: int = T):
    """Row 0 starts documents at 4 (a chunk boundary of 4) and 7 (inside a chunk); row 1 at 0 (the carried state is
    forgotten at once)."""
    starts = torch.zeros(B, length, dtype=torch.bool)
    starts[0, [4, 7]] = True
    starts[1, 0] = True
    return starts


def decay(kind: str | None):
    """None, a log-decay per head (B, T, H), or one per key channel (B, T, H, K); all <= 0."""
    if kind is None:
        return None
    shape = (B, T, H) if kind == "head" else (B, T, H, K)
    return (-torch.rand(*shape, dtype=torch.float64)).requires_grad_()


def assert_same(first, second, tensors):
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    for a, b in zip(grads(first, tensors), grads(second, tensors)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", [None, "head", "channel"])
@pytest.mark.parametrize("with_docs", [False, True])
def test_the_three_forms_of_the_decayed_scan_agree(kind, with_docs):
    """The quadratic masked form (the reference), the chunked form (chunks of 4 over 13 positions, so padded) and
    the recurrence: outputs, final state and the gradients of q, k, v, the decays and the carried state."""
    torch.manual_seed(0)
    q, k, v, state = leaf(B, T, H, K), leaf(B, T, H, K), leaf(B, T, H, V), leaf(B, H, K, V)
    g = decay(kind)
    starts = starts_for() if with_docs else None
    tensors = [t for t in (q, k, v, g, state) if t is not None]
    reference = scan_quadratic(q, k, v, g, state, starts)
    assert_same(scan_in_chunks(q, k, v, g, state, starts), reference, tensors)
    assert_same(scan_recurrent(q, k, v, g, state, starts), reference, tensors)


@pytest.mark.parametrize("with_docs", [False, True])
def test_the_three_forms_of_the_delta_rule_agree(with_docs):
    """The whole sequence as one triangular system (the reference), the chunked WY form (chunks of 4) and the rule
    applied position by position: outputs, final state and the gradients of q, k, v, beta and the state."""
    torch.manual_seed(1)
    q, v, state = leaf(B, T, H, K), leaf(B, T, H, V), leaf(B, H, K, V)
    k_raw, beta = leaf(B, T, H, K), leaf(B, T, H, positive=True)
    k = torch.nn.functional.normalize(k_raw, dim=-1)  # DeltaNet's keys: unit length, so the rule is a contraction
    starts = starts_for() if with_docs else None
    tensors = [q, k_raw, v, beta, state]
    reference = delta_quadratic(q, k, v, beta, state, starts)
    assert_same(delta_in_chunks(q, k, v, beta, state, starts), reference, tensors)
    assert_same(delta_recurrent(q, k, v, beta, state, starts), reference, tensors)


def scan_in_chunks(q, k, v, g, state=None, starts=None):
    return scan_chunked(q, k, v, g, 4, state, starts)


def delta_in_chunks(q, k, v, beta, state=None, starts=None):
    return delta_chunked(q, k, v, beta, 4, state, starts)


def in_pieces(scan, cuts, *tensors, state=None, starts=None):
    """``scan`` over the pieces between ``cuts``, the state of each piece entering the next."""
    outs = []
    for lo, hi in zip(cuts, cuts[1:]):
        piece = [None if t is None else t[:, lo:hi] for t in tensors]
        out, state = scan(*piece, state, None if starts is None else starts[:, lo:hi])
        outs.append(out)
    return torch.cat(outs, dim=1), state


@pytest.mark.parametrize("with_docs", [False, True])
def test_chunked_with_the_state_carried_equals_the_whole_sequence(with_docs):
    """Pieces of 5, 2 and 6 positions (which cut through the chunks of 4) with the state carried give the outputs
    and final state of one pass over the whole sequence, for the decayed scan and the delta rule."""
    torch.manual_seed(2)
    q, k, v = leaf(B, T, H, K), leaf(B, T, H, K), leaf(B, T, H, V)
    g, beta = decay("channel"), leaf(B, T, H, positive=True)
    starts, cuts = (starts_for() if with_docs else None), [0, 5, 7, T]
    whole = scan_quadratic(q, k, v, g, None, starts)
    pieces = in_pieces(scan_in_chunks, cuts, q, k, v, g, starts=starts)
    assert_same(pieces, whole, [q, k, v, g])
    k = torch.nn.functional.normalize(k, dim=-1)
    whole = delta_quadratic(q, k, v, beta, None, starts)
    pieces = in_pieces(delta_in_chunks, cuts, q, k, v, beta, starts=starts)
    assert_same(pieces, whole, [q, k, v, beta])


def test_a_document_start_forgets_everything_before_it():
    """After a start, outputs and the final state do not depend on the carried state or on earlier positions."""
    torch.manual_seed(3)
    q, k, v = leaf(B, T, H, K), leaf(B, T, H, K), leaf(B, T, H, V)
    g, beta, starts = decay("head"), leaf(B, T, H, positive=True), starts_for()
    k = torch.nn.functional.normalize(k, dim=-1)
    for scan, gate in ((scan_in_chunks, g), (delta_in_chunks, beta)):
        out, final = scan(q, k, v, gate, torch.randn(B, H, K, V, dtype=torch.float64), starts)
        alone, alone_final = scan(q[:, 7:], k[:, 7:], v[:, 7:], gate[:, 7:], None, None)
        torch.testing.assert_close(out[0, 7:], alone[0], rtol=0, atol=1e-12)  # row 0's last document starts at 7
        torch.testing.assert_close(final[0], alone_final[0], rtol=0, atol=1e-12)
        fresh, _ = scan(q, k, v, gate, None, None)
        torch.testing.assert_close(out[1], fresh[1], rtol=0, atol=1e-12)  # row 1 starts at 0: no carried state
