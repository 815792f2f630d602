"""The memory object: every forward returns a new memory and leaves the one it was given untouched; a superseded
ring memory is refused; the key/value memory gives the hidden-state memory's outputs without re-projecting it, and
its ring storage equals concatenating and truncating."""

import pytest
import torch
from support import raises_naming

from longseq import ModelConfig, TransformerXLLM
from longseq.config.stored import Stored, settle_v3
from longseq.eval import evaluate
from longseq.model import HiddenMemory, KVMemory, Memory, RingMemory

BASE = dict(vocab_size=40, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.1, mem_len=7)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"same_length": True, "clamp_len": 4},
        {"pre_lnorm": True, "untie_r": True},
        {"cutoffs": [10, 20], "div_val": 2},
    ],
)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_kv_memory_equals_hidden_state_memory(overrides, dtype, tol):
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**BASE, **overrides})).to(dtype).eval()
    x = torch.randint(0, 40, (2, 40))
    hidden_mems, kv_mems = None, Memory.empty(KVMemory)
    position = 0
    for length in (5, 1, 1, 9, 3, 1, 12, 1, 1):  # segments and single-token steps, memory full and not
        inp = x[:, position : position + length]
        position += length
        expected = model(inp, hidden_mems)
        actual = model(inp, kv_mems)
        assert torch.allclose(expected.logits, actual.logits, atol=tol, rtol=0), (
            (expected.logits - actual.logits).abs().max()
        )
        hidden_mems, kv_mems = expected.mems, actual.mems
        assert kv_mems.length == hidden_mems[0].size(1) == min(7, position)
    # the carried W_R R table was reused, not rebuilt, once it covered the longest segment
    assert kv_mems.table is not None and kv_mems.table[0][0].size(1) >= 7 + 12 + 1


def test_kv_memory_projects_only_the_new_positions():
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**BASE)).eval()
    rows = []
    model.transformer.stack.layers[0].dec_attn.qkv_net.register_forward_hook(
        lambda m, args, out: rows.append(args[0].shape[1])
    )
    x = torch.randint(0, 40, (2, 20))
    hidden_mems, kv_mems = None, Memory.empty(KVMemory)
    for start in range(0, 20, 5):
        hidden_mems = model(x[:, start : start + 5], hidden_mems).mems
    assert rows == [5, 5, 5, 7, 5, 7, 5]  # the memory projected again, then the segment, every time
    rows.clear()
    for start in range(0, 20, 5):
        kv_mems = model(x[:, start : start + 5], kv_mems).mems
    assert rows == [5, 5, 5, 5]


def test_kv_memory_with_wrong_batch_is_an_error():
    model = TransformerXLLM(ModelConfig(**BASE)).eval()
    mems = model(torch.randint(0, 40, (2, 4)), Memory.empty(KVMemory)).mems
    with pytest.raises(ValueError, match="a key/value memory must hold"):
        model(torch.randint(0, 40, (3, 4)), mems)


def test_evaluate_gives_the_same_loss_with_either_memory():
    import numpy as np

    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**BASE)).double()
    ids = np.random.default_rng(0).integers(0, 40, 400)
    settings = dict(batch_size=3, tgt_len=6, recurrence=model.config.recurrence(mem_len=20, same_length=True))
    kv = evaluate(model, ids, kv_memory=True, **settings)
    hidden = evaluate(model, ids, kv_memory=False, **settings)
    assert kv["tokens"] == hidden["tokens"] == 3 * 132 and abs(kv["loss"] - hidden["loss"]) < 1e-12
    assert model.training  # evaluate restores the mode it found


def test_ring_buffer_equals_concatenate_and_truncate():
    from longseq.model.memory import RingBuffer

    ring, reference = RingBuffer(7, dim=1), torch.zeros(2, 0, 3)
    generator = torch.Generator().manual_seed(0)
    storage = None
    for n in (3, 1, 5, 9, 2, 7, 1, 1, 6, 4):
        x = torch.randn(2, n, 3, generator=generator)
        ring.append(x)
        reference = torch.cat([reference, x], dim=1)[:, -7:]
        assert torch.equal(ring.view(), reference)
        assert torch.equal(ring.view(4), reference[:, -4:])
        storage = storage or ring.storage.data_ptr()
        assert ring.storage.data_ptr() == storage  # never reallocated


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_ring_kv_memory_equals_concatenating_kv_memory(dtype, tol):
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**BASE, "same_length": True})).to(dtype).eval()
    x = torch.randint(0, 40, (2, 40))
    plain, ring = Memory.empty(KVMemory), Memory.empty(RingMemory)
    position = 0
    for length in (5, 1, 1, 9, 3, 1, 1, 1, 4, 1):
        inp = x[:, position : position + length]
        position += length
        a, b = model(inp, plain), model(inp, ring)
        assert torch.allclose(a.logits, b.logits, atol=tol, rtol=0)
        plain, ring = a.mems, b.mems
        assert ring.length == plain.length


SMALL = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=6)


def _snapshot(memory: Memory) -> list[torch.Tensor]:
    return [t.clone() for layer in memory.layers for t in layer.all_tensors()]


@pytest.mark.parametrize(
    "kind,overrides",
    [(HiddenMemory, {}), (HiddenMemory, {"cmem_len": 4, "cmem_rate": 2, "mem_quant": "int8"}),
     (HiddenMemory, {"mem_tokens": 2}), (HiddenMemory, {"mem_select": "attention"}), (KVMemory, {})],
)  # fmt: skip
def test_every_call_returns_a_new_memory_and_leaves_its_input_untouched(kind, overrides):
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**SMALL, **overrides)).eval()
    x = torch.randint(0, 30, (2, 20))
    memory = Memory.empty(kind)
    for lo in range(0, 20, 5):
        before = _snapshot(memory)
        new = model(x[:, lo : lo + 5], memory).mems
        assert new is not memory
        after = _snapshot(memory)
        assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))
        again = model(x[:, lo : lo + 5], memory).mems  # the old memory still gives the same answer
        assert all(torch.equal(a, b) for a, b in zip(_snapshot(new), _snapshot(again)))
        memory = new


def test_a_superseded_ring_memory_is_refused_by_name():
    model = TransformerXLLM(ModelConfig(**SMALL)).eval()
    x = torch.randint(0, 30, (1, 4))
    first = model(x, Memory.empty(RingMemory)).mems
    model(x, first)  # writes the ring in place: ``first`` is now stale
    with pytest.raises(ValueError, match="superseded"):
        model(x, first)


OTHERS = {  # models whose memories do not fit one another
    "gla": dict(mixer=["gla"], mem_len=0),
    "gla-4-heads": dict(mixer=["gla"], mem_len=0, n_head=4),
    "delta": dict(mixer=["delta"], mem_len=0),
    "ssm": dict(mixer=["ssm"], mem_len=0, head_dim=8),
    "xl": dict(mem_len=4),
    "hybrid": dict(mixer=["gla", "attention"], mem_len=4),
    "hourglass": dict(n_layer=4, shorten_layers=[1, 3], mem_len=4),
    "learned-chunks": dict(n_layer=4, shorten_layers=[1, 3], boundaries="learned", mem_len=4),
    "hourglass-gla": dict(n_layer=4, shorten_layers=[1, 3], mixer=["gla", "attention", "attention", "gla"], mem_len=4),
}


def test_a_memory_of_another_model_is_refused_by_name():
    """A memory (or a transformers cache, which holds one) passed to a model that did not make it: a ValueError that
    names the layer and says it is another model's, before any layer runs; each model takes its own."""
    base = dict(vocab_size=40, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0)
    models = {name: TransformerXLLM(ModelConfig(**{**base, **extra})).eval() for name, extra in OTHERS.items()}
    x = torch.randint(0, 40, (2, 5))
    memories = {name: model(x).mems for name, model in models.items()}
    for name, model in models.items():
        model(x, memories[name])
        for other, memory in memories.items():
            if other != name:
                with raises_naming(ValueError, "mems", "another model"):
                    model(x, memory)


# --- the state kinds: split/join, select and checkpoints --------------------------------------------------------

KINDS = {
    "xl": {},
    "int8-compressed": {"cmem_len": 4, "cmem_rate": 2, "mem_quant": "int8"},
    "tokens": {"mem_tokens": 2},
    "hybrid-ssm-conv-rnn": {"mixer": ["ssm", "attention", "conv", "rnn"], "n_layer": 4},
    "hourglass": {"n_layer": 4, "shorten_layers": [1, 3], "shorten_factor": 2},
    "learned-chunks": {"n_layer": 4, "shorten_layers": [1, 3], "shorten_factor": 2, "boundaries": "learned"},
}


def _flat(memory: Memory) -> list:
    """Everything a memory holds, in order: each layer's kind, its tensors and (hourglass) its phase and inner
    memory; then the document ids, the memory tokens and the last document."""
    out = []
    for layer in memory.layers:
        out.append(type(layer).__name__)
        out += layer.all_tensors()
        out.append(getattr(layer, "phase", None))
    return out + [memory.doc_ids, memory.tokens, memory.last_doc, memory.kind]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b, strict=True)
    )


def _memory_of(name: str, kind=HiddenMemory, docs: bool = False):
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**SMALL, **KINDS[name]})).eval()
    x = torch.randint(0, 30, (4, 15))
    doc_ids = (torch.arange(15)[None, :] // 6 + torch.arange(4)[:, None]).expand(4, 15) if docs else None
    memory = Memory.empty(kind)
    for lo, hi in ((0, 5), (5, 9)):  # the memory (and an hourglass's shortened one) holds something, mid-group
        memory = model(x[:, lo:hi], memory, doc_ids=None if doc_ids is None else doc_ids[:, lo:hi]).mems
    return model, memory, x[:, 9:]


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_state_kind_round_trips_through_split_join_select_and_a_checkpoint(name, tmp_path):
    from safetensors.torch import load_file, save_file

    model, memory, nxt = _memory_of(name, docs=name in ("xl", "hybrid-ssm-conv-rnn", "hourglass", "learned-chunks"))
    assert _same(_flat(Memory.join(memory.split(2))), _flat(memory))
    assert [len(part.layers) for part in memory.split(4)] == [len(memory.layers)] * 4

    # a checkpoint: named tensors through a file, the same kinds and values, and the same continuation
    save_file(memory.to_tensors(), tmp_path / "memory.safetensors")
    loaded = Memory.from_tensors(load_file(tmp_path / "memory.safetensors"), tokens_age=memory.tokens_age)
    assert _same(_flat(loaded), _flat(memory))
    assert torch.equal(model(nxt, loaded).logits, model(nxt, memory).logits)

    # selecting streams (reordered, repeated) continues each stream as it would have continued
    rows = torch.tensor([2, 0, 0, 3])
    whole = model(nxt, memory).logits
    picked = model(nxt[rows], memory.select(rows)).logits
    torch.testing.assert_close(picked, whole[rows], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", [KVMemory, RingMemory])
def test_key_value_kinds_select_streams_and_refuse_what_they_cannot_do(kind):
    model, memory, nxt = _memory_of("xl", kind)
    rows = torch.tensor([3, 1])
    expected = model(nxt, _memory_of("xl", kind)[1]).logits[rows]  # a fresh copy: a ring is written in place
    torch.testing.assert_close(model(nxt[rows], memory.select(rows)).logits, expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="saved in checkpoints"):
        memory.to_tensors()
    if kind is KVMemory:
        assert _same(_flat(Memory.join(memory.split(2))), _flat(memory))
    else:
        with pytest.raises(ValueError, match="ring memory is written in place"):
            memory.split(2)


def test_an_hourglass_state_saved_in_the_older_layout_loads_with_its_phase():
    """Checkpoints written before the state kinds kept an hourglass's phase only inside its state tuple (its
    third tensor) and wrote no phase key at phase 0: they load as an hourglass state with that phase."""
    _, memory, _ = _memory_of("hourglass")
    (index,) = [i for i, layer in enumerate(memory.layers) if type(layer).__name__ == "HourglassState"]
    tensors = memory.to_tensors()
    phase = memory.layers[index].phase
    assert phase == 1 and memory.layers[index].inner.mem_length > 0  # 9 positions at factor 2: mid-group
    del tensors[f"memory.phase.{index}"]
    loaded = Memory.from_tensors(settle_v3(Stored({}, training=tensors)).training)  # as a checkpoint is read
    assert type(loaded.layers[index]).__name__ == "HourglassState" and loaded.layers[index].phase == phase
    assert _same(_flat(loaded), _flat(memory))
