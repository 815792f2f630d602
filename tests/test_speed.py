"""The model FLOPs behind MFU: the count of model_flops_per_token equals PyTorch's FLOP counter on a forward pass of
the readable reference kernel (which scores every (query, key) pair), by part, in training and with a key/value
memory."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from longseq.config import ModelConfig
from longseq.eval.speed import model_flops_per_token
from longseq.model import Memory, TransformerXLLM

CONFIG = dict(vocab_size=50, n_layer=2, d_model=32, n_head=4, d_head=8, d_inner=64, dropout=0.0, mem_len=6)


def counted(model, *args, **kwargs) -> int:
    with FlopCounterMode(display=False) as counter:
        model(*args, **kwargs)
    return counter.get_total_flops()


@pytest.mark.parametrize("pos", ["sinusoidal", "shaw"])
def test_training_forward_flops_are_counted_exactly(pos):
    config = ModelConfig(**CONFIG, attn_impl="reference", attn_chunk=0, pos=pos)
    model = TransformerXLLM(config)
    x = torch.randint(0, 50, (3, 10))
    mems = model(x).mems  # a full memory of 6
    flops = model_flops_per_token(config, tgt_len=10, mem_len=6, batch=3, keys_per_query=16)
    assert counted(model, x, mems, x) == pytest.approx(flops["forward"] * 3 * 10, rel=1e-12)
    assert flops["train"] == 3 * flops["forward"]


def test_evaluation_with_a_key_value_memory_projects_only_the_segment():
    config = ModelConfig(**CONFIG, attn_impl="reference", attn_chunk=0)
    model = TransformerXLLM(config).eval()
    x = torch.randint(0, 50, (3, 10))
    with torch.no_grad():
        mems = model(x, Memory.empty("kv"), mem_len=6).mems
        flops = model_flops_per_token(config, tgt_len=10, mem_len=6, batch=3, keys_per_query=16, kv_memory=True)
        assert counted(model, x, mems, x, mem_len=6) == pytest.approx(flops["forward"] * 3 * 10, rel=1e-12)


def test_default_keys_per_query_is_full_causal_attention():
    config = ModelConfig(**CONFIG)
    full = model_flops_per_token(config, tgt_len=10, mem_len=6)
    explicit = model_flops_per_token(config, tgt_len=10, mem_len=6, keys_per_query=6 + 11 / 2)
    assert full == explicit
