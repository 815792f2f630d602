"""Speed measurements (``eval/speed.py``, ``longseq bench``).  The model FLOPs behind MFU: the count of
model_flops_per_token equals PyTorch's FLOP counter on a forward pass of the readable reference kernel (which scores
every (query, key) pair), by part, in training (every position encoding, gated feed-forwards, shared key/value
heads) and with a key/value memory, and of an hourglass's coarse layers
and its own maps (fixed groups; learned and entropy chunks at the rate they were cut).  The bench commands report each task,
the medians of their rounds, and name a size out of range before measuring anything."""

import json

import pytest
import torch
from support import assert_names, last_json
from torch.utils.flop_counter import FlopCounterMode

from longseq import ModelConfig, TransformerXLLM
from longseq.cli import main
from longseq.eval.speed import model_flops_per_token
from longseq.model import KVMemory, Memory

CONFIG = dict(vocab_size=50, n_layer=2, d_model=32, n_head=4, d_head=8, d_inner=64, dropout=0.0, mem_len=6)


def counted(model, *args, **kwargs) -> int:
    with FlopCounterMode(display=False) as counter:
        model(*args, **kwargs)
    return counter.get_total_flops()


BLOCKS = {  # today's options: a position score per pair or none, a gated feed-forward, shared key/value heads
    "sinusoidal": dict(),
    "shaw": dict(pos="shaw"),
    "rope-swiglu-gqa": dict(pos="rope", ff="swiglu", n_kv_head=2, qk_norm=True, bias=False, norm="rmsnorm"),
    "alibi-geglu": dict(pos="alibi", ff="geglu"),
    "t5-gelu": dict(pos="t5", ff="gelu"),
    "nope-mqa": dict(pos="nope", n_kv_head=1),
}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_training_forward_flops_are_counted_exactly(name):
    config = ModelConfig(**CONFIG, attn_impl="reference", attn_chunk=0, **BLOCKS[name])
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
        mems = model(x, Memory.empty(KVMemory), recurrence=model.config.recurrence(mem_len=6)).mems
        flops = model_flops_per_token(config, tgt_len=10, mem_len=6, batch=3, keys_per_query=16, kv_memory=True)
        assert counted(model, x, mems, x, recurrence=model.config.recurrence(mem_len=6)) == pytest.approx(
            flops["forward"] * 3 * 10, rel=1e-12
        )


HOURGLASSES = {
    "fixed": dict(shorten_factor=2),
    "fixed-mean": dict(shorten_factor=3, shorten_fn="mean"),
    "fixed-coarse-memory": dict(shorten_factor=2, coarse_mem_len=4),
    "learned": dict(shorten_factor=3, boundaries="learned"),
    "entropy": dict(shorten_factor=3, boundaries="entropy", entropy_rule="global", coarse_mem_len=2),
}


@pytest.mark.parametrize("name", sorted(HOURGLASSES))
def test_an_hourglass_forward_flops_are_counted_exactly(name):
    """Layers 1 and 2 of 4 at the coarse level (a full memory at both levels): fixed groups, and chunks of the
    length the predictor cut (one row, so no padding of rows), with the smoothing scan's padded last block."""
    import math

    from longseq.model.boundaries import SMOOTH_CHUNK

    config = ModelConfig(**{**CONFIG, "n_layer": 4}, attn_impl="reference", attn_chunk=0, shorten_layers=[1, 3],
                         **HOURGLASSES[name])  # fmt: skip
    torch.manual_seed(0)
    model = TransformerXLLM(config).eval()
    block = model.transformer.stack.layers[1]
    cuts = []
    if config.hourglass.dynamic:
        block.boundaries.register_forward_hook(lambda module, args, out: cuts.append(out.cuts))
    if name == "entropy":  # a head sure of some tokens and not of others, so that it cuts
        with torch.no_grad():
            block.boundaries.head.weight.normal_(0, 1.0)
    batch, length = (3, 12) if not config.hourglass.dynamic else (1, 30)
    x = torch.randint(0, 50, (batch, 40))
    y = torch.randint(0, 50, (batch, length))
    with torch.no_grad():
        mems = model(x).mems
        got = counted(model, y, mems, y)
    coarse_mem = config.coarse_mem()
    assert mems.layers[1].inner.mem_length == coarse_mem  # full: the steady state the count describes
    chunks, padding = length / config.hourglass.shorten_factor, 0.0
    if cuts:
        chunks = int(cuts[-1].sum())
        per_block_slot = 2 * (SMOOTH_CHUNK + (SMOOTH_CHUNK + 2) * config.d_model)
        padding = (math.ceil(chunks / SMOOTH_CHUNK) * SMOOTH_CHUNK - chunks) * per_block_slot
    flops = model_flops_per_token(config, tgt_len=length, mem_len=6, batch=batch, keys_per_query=6 + length,
                                  chunk_length=length / chunks, coarse_keys_per_query=coarse_mem + chunks)  # fmt: skip
    assert got == pytest.approx(flops["forward"] * batch * length + padding, rel=1e-12)


def test_default_keys_per_query_is_full_causal_attention():
    config = ModelConfig(**CONFIG)
    full = model_flops_per_token(config, tgt_len=10, mem_len=6)
    explicit = model_flops_per_token(config, tgt_len=10, mem_len=6, keys_per_query=6 + 11 / 2)
    assert full == explicit


def test_bench_cli_reports_each_task(capsys):
    small = ["--tgt-len", "8", "--mem-len", "16", "--batch", "2", "--steps", "1"]
    assert main(["bench", "train", *small, "--json"]) == 0
    train = last_json(capsys)
    assert train["task"] == "train" and train["tokens_per_s"] > 0 and train["peak_rss_mb"] > 0
    assert main(["bench", "eval", *small, "--json"]) == 0
    assert last_json(capsys)["ms_per_token"] > 0
    assert (
        main(["bench", "generate", *small, "--prompt-len", "20", "--new-tokens", "5", "--device", "cpu", "--json"]) == 0
    )
    generated = last_json(capsys)
    assert generated["tokens_per_s"] > 0 and generated["device"] == "cpu" and train["device"] == "cpu"
    if not torch.cuda.is_available():  # --device cuda where there is no GPU: one line that says so
        assert main(["bench", "eval", *small, "--device", "cuda", "--json"]) == 2
        assert "no GPU that torch can use" in capsys.readouterr().err


def test_eval_speed_command_reports_medians_and_their_ratio(capsys):
    """The JSON a user reads: one object per length with the two times and their ratio; with rounds, the
    reported times are the medians of the rounds kept beside them."""
    from longseq.cli import main

    assert main(["bench", "eval-speed", "--attn-len", "16", "24", "--tgt-len", "8", "--steps", "1", "--rounds", "3",
                 "--threads", "1", "--json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["lengths"]
    assert [r["attn_len"] for r in rows] == [16, 24]
    for row in rows:
        assert row["ratio"] == row["vanilla_ms_per_token"] / row["xl_ms_per_token"]
        for key in ("xl_ms_per_token", "vanilla_ms_per_token"):
            assert len(row["rounds"][key]) == 3 and row[key] == sorted(row["rounds"][key])[1]


@pytest.mark.parametrize("argv,words", [(["eval", "--steps", "0"], ("--steps", ">= 1", "0")),
                                        (["train", "--batch", "-1"], ("--batch", ">= 1", "-1")),
                                        (["generate", "--new-tokens", "0"], ("--new-tokens", ">= 1", "0")),
                                        (["eval-speed", "--attn-len", "0"], ("--attn-len", ">= 1"))])  # fmt: skip
def test_bench_names_a_size_out_of_range_before_measuring_anything(argv, words, capsys, monkeypatch):
    """``bench eval --steps 0`` built the model, ran the memory-filling segments and died in a ZeroDivisionError."""
    import longseq.eval.speed as speed

    def never(*args, **kwargs):
        raise AssertionError("a benchmark ran")

    for name in ("eval_per_token", "train_throughput", "generate_speed", "eval_speed_vs_vanilla", "bench_config"):
        monkeypatch.setattr(speed, name, never)
    assert main(["bench", *argv]) == 2
    assert_names(capsys.readouterr().err, *words)


@pytest.mark.parametrize("name", ["full", "window", "dilated", "strided", "block_sparse", "global", "bigbird"])
def test_mfu_counts_the_keys_the_pattern_allows(name):
    """MFU counted full attention's FLOPs for window and block-sparse runs (gpu_check's train_speed): a window of 256
    over 32k tokens was credited with 16k keys a query.  keys_per_query is the dense mask's count of allowed pairs
    over queries, and the attention FLOPs follow it."""
    from longseq.eval.speed import keys_per_query, mfu
    from longseq.model.attention.patterns import layer_patterns

    config = ModelConfig(vocab_size=50, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, attention=[name],
                         mem_len=20, window=6, dilation=[1, 2], stride=5, block_size=8, block_summary=2,
                         num_random_blocks=1)  # fmt: skip
    tgt_len, mem_len = 37, 20
    klen = tgt_len + mem_len
    query, key = torch.arange(mem_len, klen)[:, None], torch.arange(klen)[None, :]
    dense = layer_patterns(config)[0].allowed(query, key, klen) & (key <= query)  # (H or 1, T, K)
    assert keys_per_query(config, tgt_len, mem_len) == pytest.approx(
        round(float(dense.sum()) / dense.size(0)) / tgt_len
    )
    full = ModelConfig(**{**config.to_dict(), "pattern": {**config.to_dict()["pattern"], "attention": ["full"]}})
    ours, dense_mfu = (mfu(c, 1000.0, tgt_len, mem_len, 1, 1e9, training=True)["mfu"] for c in (config, full))
    assert (ours < dense_mfu) == (name != "full") and ours <= dense_mfu
