"""The block's dropout (``longseq.model.block.dropout``): ``F.dropout`` with its mask drawn from integer bits on a
CPU.  Held to F.dropout's definition: every element kept independently with probability 1 - p (each of the four
or two decisions of a 64-bit draw, neighbours uncorrelated, within 6 standard deviations over a million
elements; the rate the bits can express within 1e-4 of p, relative), kept values exactly
x * (1 / (1 - p)) in the tensor's dtype and the rest 0, the gradient the same mask times the same scale; and
F.dropout itself where the fast path does not apply."""

import math

import pytest
import torch
import torch.nn.functional as F

from longseq import ModelConfig, TransformerXLLM
from longseq.model.block import Dropout, dropout, dropout_noise, noise_bits

N = 1 << 20


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.05])  # 0.05: not a multiple of 2^-15, so 31 bits decide
def test_each_element_is_kept_with_probability_one_minus_p(dtype, p):
    torch.manual_seed(0)
    x = torch.randn(4, N // 4, dtype=dtype)
    out = dropout(x, p)
    kept = out != 0
    scale = torch.tensor(1 / (1 - p), dtype=dtype)
    assert torch.equal(out[kept], x[kept] * scale) and not out[~kept].any()
    per_draw = 1 if dtype == torch.float64 else 64 // (noise_bits(p) + 1)
    for part in (kept.flatten(), *(kept.flatten()[i::per_draw] for i in range(per_draw))):  # each part of a draw
        n = part.numel()
        assert abs(part.sum().item() - n * (1 - p)) < 6 * math.sqrt(n * p * (1 - p))
    flat = kept.flatten().double()
    neighbours = torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1].item()
    assert abs(neighbours) < 6 / math.sqrt(N)


def test_the_bits_express_both_rates_within_a_relative_1e_minus_4():
    """15 bits where a multiple of 2^-15 is within 1e-4 of p relative to the smaller of p and 1 - p, else 31: the
    drop rate round(p 2^bits) / 2^bits, and so the keep rate that the scale 1 / (1 - p) assumes, are right to that
    bound (or to 2^-32) for every p on a fine grid, near 0 and 1 included; a p within 2^-31 of 1 takes F.dropout."""
    assert noise_bits(0.1) == noise_bits(0.25) == noise_bits(0.9) == 15
    assert noise_bits(0.05) == noise_bits(1e-6) == noise_bits(0.9999) == noise_bits(0.99999) == 31
    grid = torch.linspace(1e-6, 1 - 1e-6, 10_001, dtype=torch.float64).tolist() + [1 - 1e-4, 1 - 1e-5, 1 - 2**-30]
    for p in grid:
        threshold, levels = round(p * 2 ** noise_bits(p)), 2 ** noise_bits(p)
        assert threshold < levels and abs(threshold / levels - p) <= max(1e-4 * min(p, 1 - p), 2**-32), p
    assert not dropout(torch.ones(1 << 16), 1 - 2**-33).any()  # F.dropout's: the integer threshold would overflow


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_the_gradient_is_the_same_mask_times_the_scale(dtype):
    torch.manual_seed(0)
    x = torch.ones(64, 1000, dtype=dtype, requires_grad=True)
    out = dropout(x, 0.3)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert torch.equal(x.grad, grad * out.detach())  # x = 1: out is the noise, 0 or 1 / (1 - p)
    assert out.detach().unique().tolist() == [0.0, torch.tensor(1 / 0.7, dtype=dtype).item()]


def test_a_seed_fixes_the_masks_and_draws_differ():
    torch.manual_seed(3)
    first, second = dropout_noise(torch.empty(1000), 0.2), dropout_noise(torch.empty(1000), 0.2)
    torch.manual_seed(3)
    assert torch.equal(dropout_noise(torch.empty(1000), 0.2), first) and not torch.equal(first, second)


def test_elsewhere_it_is_f_dropout():
    x = torch.randn(100, 100)
    assert dropout(x, 0.1, training=False) is x and torch.equal(dropout(x, 0.0), x)
    assert not dropout(x, 1.0).any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_what_f_dropout_keeps_scaled_as_it_scales(dtype):
    """F.dropout scales a half tensor by 1 / (1 - p) rounded to its dtype (1.109375 in bfloat16 for p = 0.1): the
    elements both keep are equal, bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(512, 512).to(dtype)
    ours, theirs = dropout(x, 0.1), F.dropout(x, 0.1)
    both = (ours != 0) & (theirs != 0)
    assert both.sum() > 0.7 * x.numel() and torch.equal(ours[both], theirs[both])


def test_every_dropout_of_the_transformer_is_the_blocks():
    model = TransformerXLLM(ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32))
    found = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(found) == 1 + 2 * 3 + 1 and all(type(m) is Dropout for m in found)  # input and output, 3 a layer, R


def test_every_dropout_of_a_mixer_stack_is_the_blocks():
    config = ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mixer=["gla", "ssm"])
    found = [m for m in TransformerXLLM(config).modules() if isinstance(m, torch.nn.Dropout)]
    assert found and all(type(m) is Dropout for m in found)
