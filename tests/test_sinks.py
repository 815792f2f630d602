"""Attention sinks (StreamingLLM): the first ``sinks`` positions of a stream kept in the memory for ever beside the
recent ``mem_len``, seen by every query.

Claims: a stream read in segments (every memory kind: hidden states, keys and values, the ring; one token at a time)
gives the logits of a naive float64 reference that lists, for every query, the keys it sees and the position of
each (sinks kept at their slot in the cache, or at their text position), with the window pattern, ``same_length``
and full attention; with sinks=0 the same reference is the plain memory's, and sinks that are never evicted change
nothing, bit for bit; generation's memory never holds more than sinks + mem_len positions, and its storage stays
what it was after the prompt; a memory with sinks goes through a checkpoint and continues the same way, and a
training run with sinks resumes exactly; what sinks cannot combine with is refused by name.
"""

from __future__ import annotations

import math

import pytest
import torch
from support import assert_resumes_exactly, checkpoint_and_valid_ids, cli_json, raises_naming, tiny_run

from longseq.config import ModelConfig, Recurrence, RunConfig
from longseq.eval.evaluate import evaluate
from longseq.generation import generate, read_prompt
from longseq.model import HiddenMemory, KVMemory, Memory, RingMemory, TransformerXLLM
from longseq.model.positions import rotate_half
from longseq.train import load_checkpoint

N, SINKS, MEM, WINDOW = 37, 3, 8, 5


def llama(attention: str = "full", **extra) -> TransformerXLLM:
    """A tiny float64 model of the llama-xl block: rope, RMSNorm before each sub-layer, SwiGLU, grouped-query."""
    config = ModelConfig(
        vocab_size=50, n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_head=8, d_inner=48, dropout=0.0,
        pos="rope", rope_theta=50.0, norm="rmsnorm", ff="swiglu", pre_lnorm=True, final_norm=True, bias=False,
        embed_scale=False, head_bias=False, attention=attention, window=WINDOW, mem_len=MEM, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    return TransformerXLLM(config).double().eval()


def visible(t: int, segment: int, sinks: int, mem_len: int, window: int | None, same_length: bool, text: bool):
    """What query ``t`` of a stream read in segments of ``segment`` sees: the stream positions of its keys, their
    positions and its own.  The memory at the start of its segment holds the stream's first ``sinks`` positions and
    the last ``mem_len`` after them; a key's slot in the cache is its stream position less the positions evicted
    between the sinks and the memory (``gap``); the window and ``same_length`` count slots and spare the sinks."""
    start = t // segment * segment
    gap = max(0, start - mem_len - sinks)
    slot = lambda s: s if s < sinks else s - gap  # noqa: E731
    keys, positions = [], []
    for s in range(t + 1):
        if s >= sinks:
            distance = slot(t) - slot(s)
            if s < max(sinks, start - mem_len) or (window and distance >= window):
                continue
            if same_length and distance >= mem_len:
                continue
        keys.append(s)
        positions.append(s if text else slot(s))
    return keys, positions, t if text else slot(t)


def rotated(x: torch.Tensor, positions: list[int], theta: float) -> torch.Tensor:
    """(H, L, D) rotated at ``positions``: channel k and k + D/2 turned by position * theta^(-2k/D)."""
    d = x.size(-1)
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.tensor(positions, dtype=torch.float64)[:, None] * freq
    angles = torch.cat([angles, angles], dim=-1)
    return rotate_half(x, angles.cos(), angles.sin())


@torch.no_grad()
def naive_logits(model: TransformerXLLM, ids: torch.Tensor, **seen) -> torch.Tensor:
    """The logits of ``ids`` (1, N), each query attending to exactly the keys :func:`visible` lists, at the
    positions it gives: one query at a time, scores written out, no memory."""
    backbone, c = model.transformer, model.config
    hidden = backbone.word_emb(ids)  # (1, N, E)
    for layer in backbone.stack.layers:
        attn = layer.dec_attn
        query, key, value = attn.heads(attn.layer_norm(hidden))  # (1, H, N, D), (1, Hkv, N, D) x 2
        group = c.n_head // (c.n_kv_head or c.n_head)
        key, value = key.repeat_interleave(group, 1)[0], value.repeat_interleave(group, 1)[0]  # (H, N, D)
        out = []
        for t in range(ids.size(1)):
            keys, positions, at = visible(t, **seen)
            q = rotated(query[0, :, t : t + 1], [at], c.positions.rope_theta)  # (H, 1, D)
            k = rotated(key[:, keys], positions, c.positions.rope_theta)  # (H, n, D)
            probs = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(c.d_head), dim=-1)
            out.append((probs @ value[:, keys]).transpose(0, 1).reshape(1, -1))  # (1, H * D)
        hidden = layer.pos_ff(hidden + attn.o_net(torch.cat(out)[None]))
    return model.crit.logits(backbone.final_norm(hidden)[0])[None]


@torch.no_grad()
def streamed(model, ids: torch.Tensor, segment: int, kind: type, recurrence: Recurrence) -> torch.Tensor:
    """The logits of ``ids`` read in segments of ``segment`` with a memory of ``kind`` carried."""
    mems, parts = Memory.empty(kind), []
    for lo in range(0, ids.size(1), segment):
        out = model(ids[:, lo : lo + segment], mems, recurrence=recurrence)
        parts.append(out.logits)
        mems = out.mems
    return torch.cat(parts, dim=1)


CASES = {  # attention, same_length, sinks, sink positions
    "window+sinks": ("window", False, SINKS, "cache"),
    "window+sinks, text positions": ("window", False, SINKS, "text"),
    "same_length+sinks": ("full", True, SINKS, "cache"),
    "full+sinks, text positions": ("full", False, SINKS, "text"),
    "window alone (sinks=0)": ("window", False, 0, "cache"),
    "memory alone (sinks=0)": ("full", False, 0, "cache"),
}


@pytest.mark.parametrize("kind", [HiddenMemory, KVMemory, RingMemory])
@pytest.mark.parametrize("segment", [1, pytest.param(4, marks=pytest.mark.slow), 7])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stream_read_with_sinks_equals_the_naive_reference(case, segment, kind):
    attention, same_length, sinks, where = CASES[case]
    model = llama(attention)
    ids = torch.randint(0, 50, (1, N), generator=torch.Generator().manual_seed(1))
    recurrence = Recurrence(MEM, same_length=same_length, sinks=sinks, sink_positions=where)
    window = WINDOW if attention == "window" else None
    seen = dict(segment=segment, sinks=sinks, mem_len=MEM, window=window, same_length=same_length, text=where == "text")
    torch.testing.assert_close(streamed(model, ids, segment, kind, recurrence), naive_logits(model, ids, **seen),
                               rtol=0, atol=1e-10)  # fmt: skip


def test_the_reference_sees_what_sinks_change():
    """The reference is not blind to them: with the window past the sinks, sinks change the logits, and text
    positions differ from cache positions once positions were evicted."""
    model = llama("window")
    ids = torch.randint(0, 50, (1, N), generator=torch.Generator().manual_seed(1))
    plain = streamed(model, ids, 4, KVMemory, Recurrence(MEM))
    sinks = streamed(model, ids, 4, KVMemory, Recurrence(MEM, sinks=SINKS))
    text = streamed(model, ids, 4, KVMemory, Recurrence(MEM, sinks=SINKS, sink_positions="text"))
    assert (plain[0, WINDOW:] - sinks[0, WINDOW:]).abs().amax(-1).min() > 1e-6  # every query past the window
    evicted = next(start for start in range(0, N, 4) if start > MEM + SINKS)  # the first segment after an eviction
    assert torch.equal(sinks[0, :evicted], text[0, :evicted])  # before: the same
    assert (sinks[0, -4:] - text[0, -4:]).abs().max() > 1e-6


@pytest.mark.parametrize("kind", [HiddenMemory, KVMemory, RingMemory])
def test_sinks_never_evicted_change_nothing_bit_for_bit(kind):
    """While the memory holds the whole stream, the sinks are keys it holds anyway: the same logits exactly."""
    model = llama()
    ids = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(2))
    plain = streamed(model, ids, 4, kind, Recurrence(20))
    with_sinks = streamed(model, ids, 4, kind, Recurrence(20 - SINKS, sinks=SINKS))
    assert torch.equal(plain, with_sinks)


@torch.no_grad()
def test_generation_memory_never_grows_past_sinks_and_mem_len():
    model = llama("window")
    recurrence = Recurrence(MEM, sinks=SINKS)
    mems = read_prompt(model, torch.randint(0, 50, (1, 12)), 4, recurrence)
    token, storage = torch.tensor([[1]]), None
    for _ in range(200):
        scores, mems = model.next_token_scores(token, mems, recurrence=recurrence)
        token = scores.argmax(-1, keepdim=True)
        assert mems.kind is RingMemory and mems.mem_length == SINKS + MEM
        storage = storage or mems.nbytes
        assert mems.nbytes == storage  # the ring's buffers and the sinks: allocated once
    assert mems.position == 12 + 200


def test_a_sinks_memory_goes_through_a_checkpoint_and_continues_the_same(tmp_path):
    from safetensors.torch import load_file, save_file

    model = llama("window", sinks=SINKS, sink_positions="text")
    ids = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        mems = None
        for lo in range(0, 32, 8):
            mems = model(ids[:, lo : lo + 8], mems).mems
        save_file(mems.to_tensors(), tmp_path / "memory.safetensors")
        loaded = Memory.from_tensors(load_file(tmp_path / "memory.safetensors"))
        assert loaded.position == 32 and loaded.mem_length == SINKS + MEM
        assert torch.equal(model(ids[:, 32:], loaded).logits, model(ids[:, 32:], mems).logits)


def test_a_training_run_with_sinks_resumes_exactly(tmp_path):
    def run():
        r = tiny_run(max_steps=6, eval_interval=3)
        return RunConfig(r.model.replace(memory=r.model.memory.replace(mem_len=4, sinks=2)), r.data, r.train)

    assert_resumes_exactly(run, tmp_path, stop_after=3)


def test_what_sinks_cannot_combine_with_is_refused_by_name():
    with raises_naming(ValueError, "sinks", "cmem_len"):
        ModelConfig(sinks=2, cmem_len=4, cmem_rate=2)
    with raises_naming(ValueError, "sinks", "bidirectional"):
        ModelConfig(sinks=2, bidirectional=True)
    with raises_naming(ValueError, "sink_positions=text", "pos=rope"):
        ModelConfig(sinks=2, sink_positions="text")
    with raises_naming(ValueError, "sink_positions", "cache", "text"):
        ModelConfig(sinks=2, sink_positions="middle")
    model = llama()
    ring = model(torch.zeros(1, 4, dtype=torch.long), Memory.empty(RingMemory), recurrence=Recurrence(MEM)).mems
    with raises_naming(ValueError, "ring memory", "sinks=2"):
        model(torch.zeros(1, 1, dtype=torch.long), ring, recurrence=Recurrence(MEM, sinks=2))
    with raises_naming(ValueError, "sinks", "cmem_len"):  # a call's sinks on a compacted model
        compacted = TransformerXLLM(ModelConfig(cmem_len=4, cmem_rate=2))
        compacted(torch.zeros(1, 4, dtype=torch.long), recurrence=Recurrence(64, sinks=2))


def test_eval_and_generate_take_sinks_from_the_command_line(trained_checkpoint, capsys):
    """``longseq eval --set sinks=...`` and ``longseq generate --sinks`` are the library's calls with that
    recurrence."""
    settings = ["sinks=2", "mem_len=4", "same_length=true", "max_segments=6"]
    result = cli_json(["eval", "--checkpoint", trained_checkpoint, "--json", "--quiet", "--set", *settings], capsys)
    net, ids = checkpoint_and_valid_ids(trained_checkpoint)
    streaming = Recurrence(4, same_length=True, sinks=2)
    expected = evaluate(net, ids, batch_size=2, tgt_len=8, recurrence=streaming, max_segments=6)
    assert result["loss"] == pytest.approx(expected["loss"], abs=1e-9)
    assert result["loss"] != pytest.approx(evaluate(net, ids, batch_size=2, tgt_len=8, max_segments=6)["loss"])

    argv = ["generate", "--checkpoint", trained_checkpoint, "--prompt", "abcabc", "--temperature", "0", "--json",
            "--quiet", "--max-new-tokens", "30", "--sinks", "2", "--mem-len", "4"]  # fmt: skip
    text = cli_json(argv, capsys)["text"]
    _, tokenizer, _, _ = load_checkpoint(trained_checkpoint)
    prompt = torch.as_tensor(tokenizer.encode_prompt("abcabc"))[None]
    tokens = generate(net, prompt, 30, temperature=0.0, segment_len=8, recurrence=Recurrence(4, sinks=2))
    assert text == tokenizer.decode(tokens[0].tolist())
