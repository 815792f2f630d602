"""Memory compaction: document resets, 8-bit memory, compressive memory, memory dropout."""

from dataclasses import replace

import pytest
import torch
from support import raises_naming

from longseq import ConfigError, ModelConfig, TransformerXLLM
from longseq.model import Memory, Quantized, build_model, reset_rows
from longseq.model.memory import quantize
from longseq.model.memory.compress import Compressor

BASE = dict(vocab_size=40, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=8)


def model_for(seed=0, **overrides):
    torch.manual_seed(seed)
    return TransformerXLLM(ModelConfig(**{**BASE, **overrides}))


def test_document_ids_keep_documents_apart_inside_segments_and_memory():
    model = model_for().double().eval()
    doc_a, doc_b = torch.randint(0, 40, (1, 11)), torch.randint(0, 40, (1, 9))
    stream = torch.cat([doc_a, doc_b], dim=1)  # the boundary falls inside the second segment
    docs = torch.tensor([[0] * 11 + [1] * 9])
    mems, parts = None, []
    for lo, hi in ((0, 7), (7, 14), (14, 20)):
        out = model(stream[:, lo:hi], mems, doc_ids=docs[:, lo:hi])
        parts.append(out.logits)
        mems = out.mems
    together = torch.cat(parts, dim=1)[:, 11:]
    alone = model(doc_b, recurrence=model.config.recurrence(mem_len=8)).logits
    assert torch.allclose(together, alone, atol=1e-10, rtol=0), (together - alone).abs().max()
    # and without the ids the previous document does leak in (the check can fail)
    leaky = model(stream[:, 14:20], model(stream[:, 7:14], model(stream[:, :7]).mems).mems).logits
    assert not torch.allclose(leaky[:, 5:], alone[:, 3:], atol=1e-6)


def test_reset_rows_clears_one_stream_only():
    model = model_for().double().eval()
    first, second = torch.randint(0, 40, (2, 6)), torch.randint(0, 40, (2, 5))
    mems = model(first).mems
    cleared = reset_rows(mems, torch.tensor([True, False]))
    after_reset = model(second, cleared).logits
    assert torch.allclose(after_reset[0], model(second[:1]).logits[0], atol=1e-10)  # row 0: as if fresh
    assert torch.allclose(after_reset[1], model(second, mems).logits[1], atol=1e-10)  # row 1: untouched


def test_int8_memory_error_is_within_half_a_step_and_uses_a_quarter_of_the_bytes():
    x = torch.randn(3, 10, 16) * torch.linspace(0.1, 5, 16)
    for axis, reduce in (("row", -1), ("channel", 1)):
        q = quantize(x, axis)
        bound = x.abs().amax(dim=reduce, keepdim=True) / 254 + 1e-7  # half a quantization step
        assert ((q.dequantize() - x).abs() <= bound).all()
    float_model = model_for()
    int8_model = model_for(mem_quant="int8")
    int8_model.load_state_dict(float_model.state_dict())
    float_model.eval(), int8_model.eval()
    x = torch.randint(0, 40, (2, 24))
    fm, qm, worst = None, None, 0.0
    for lo in range(0, 24, 6):
        fo, qo = float_model(x[:, lo : lo + 6], fm), int8_model(x[:, lo : lo + 6], qm)
        fm, qm = fo.mems, qo.mems
        worst = max(worst, (fo.logits.log_softmax(-1) - qo.logits.log_softmax(-1)).abs().max().item())
    assert isinstance(qm, Memory) and isinstance(qm.layers[0].hidden, Quantized)
    assert worst < 0.02  # stated tolerance on log-probabilities for this model
    assert qm.nbytes == fm.nbytes * (16 + 4) // (4 * 16)  # int8 values + one float32 scale a row


@pytest.mark.parametrize("kind", ["mean", "max", "conv", "linear"])
def test_compressive_memory_fills_and_trains_only_the_compressor(kind):
    model = model_for(cmem_len=4, cmem_rate=2, cmem_fn=kind, mem_len=6).train()
    x = torch.randint(0, 40, (2, 30))
    mems, aux_seen = None, False
    for lo in range(0, 30, 6):
        out = model(x[:, lo : lo + 6], mems, x[:, lo + 1 : lo + 7] if lo + 7 <= 30 else None)
        mems = out.mems
        if out.aux_loss is not None:
            aux_seen = True
            compressor = [
                p for n, p in model.named_parameters() if n.startswith("transformer.stack.memory.policies.compression.")
            ]
            main = [
                p
                for n, p in model.named_parameters()
                if not n.startswith("transformer.stack.memory.policies.compression.")
            ]
            grads = torch.autograd.grad(out.aux_loss, compressor + main, allow_unused=True)
            assert all(g is not None for g in grads[: len(compressor)])
            assert all(g is None for g in grads[len(compressor) :])  # the main model learns nothing from it
            if out.loss is not None:
                lm_grads = torch.autograd.grad(out.loss, compressor, allow_unused=True)
                assert all(g is None for g in lm_grads)  # and the compressor nothing from the LM loss
    assert aux_seen == (kind in ("conv", "linear"))
    assert mems.cmem_length == 4 and mems.mem_length == 6 and mems.length == 10
    assert model.config.effective_range == (6 + 2 * 4) * 2


def test_compression_functions_and_their_errors():
    states = torch.arange(2 * 6 * 3, dtype=torch.float32).view(2, 6, 3)
    assert torch.equal(Compressor("mean", 2, 3)(states), states.view(2, 3, 2, 3).mean(2))
    assert torch.equal(Compressor("max", 3, 3)(states), states.view(2, 2, 3, 3).amax(2))
    assert Compressor("mean", 4, 3)(states).shape == (2, 2, 3)  # a partial last group is pooled too
    assert Compressor("conv", 4, 3)(states).shape == (2, 2, 3)  # a short last group is padded with its last state
    with pytest.raises(ConfigError, match="needs a compression rate"):
        ModelConfig(cmem_len=8)
    with pytest.raises(ConfigError, match="without a compressed memory"):
        ModelConfig(cmem_rate=2)
    with pytest.raises(ConfigError, match="cmem_fn"):
        build_model(ModelConfig(cmem_len=4, cmem_rate=2, cmem_fn="median"))
    from support import tiny_corpus, tiny_run

    from longseq.tasks.lm import prepare_model_config

    run = tiny_run()
    run.model = ModelConfig(**{**run.model.to_dict(), "cmem_len": 4, "cmem_rate": 3, "cmem_fn": "linear"})
    with pytest.raises(ConfigError, match="must be multiples of it"):
        prepare_model_config(run, tiny_corpus())


def test_whether_a_compressor_needs_whole_groups_is_its_registry_entrys_to_say(monkeypatch):
    """The run check asks the compression function's entry (``needs_whole_groups``), not a list of names: an entry
    that needs whole groups is refused a segment that is not a multiple of the rate, by name, and accepted one that
    is; one that does not is accepted either way."""
    from longseq.config import DataConfig
    from longseq.model.memory.compress import COMPRESSION_FUNCTIONS, CompressionKind
    from longseq.model.registry import check_lengths

    model = lambda fn: ModelConfig(mem_len=6, cmem_len=4, cmem_rate=3, cmem_fn=fn)  # noqa: E731
    uneven, even = DataConfig(tgt_len=8), DataConfig(tgt_len=9)
    assert [name for name, kind in COMPRESSION_FUNCTIONS.items() if kind.needs_whole_groups] == ["conv", "linear"]
    for name, kind in COMPRESSION_FUNCTIONS.items():
        check_lengths(model(name), even)
        if kind.needs_whole_groups:
            with raises_naming(ConfigError, f"cmem_fn={name}", "cmem_rate=3", "tgt_len=8"):
                check_lengths(model(name), uneven)
        else:
            check_lengths(model(name), uneven)
    monkeypatch.setitem(COMPRESSION_FUNCTIONS, "mean", CompressionKind(learned=False, needs_whole_groups=True))
    with raises_naming(ConfigError, "cmem_fn=mean", "multiples"):
        check_lengths(model("mean"), uneven)
    with raises_naming(ConfigError, "varlen"):
        check_lengths(model("linear"), DataConfig(tgt_len=9, varlen=True))


@pytest.mark.parametrize("mixer", ["attention", "ssm,attention"])
def test_memory_dropout_masks_slots_as_a_cleared_document_would(mixer):
    """In training, a dropped slot is out of the softmax (not a zero key that stays in) and the kept slots keep their
    positions: the output equals the same weights' with the dropped slots masked by document ids.  In eval nothing
    is dropped."""
    model = model_for(mem_dropout=0.5, mixer=mixer).double()
    plain = model_for(mixer=mixer).double().eval()
    plain.load_state_dict(model.state_dict())
    x = torch.randint(0, 40, (2, 12))
    mems = plain(x[:, :6]).mems
    assert torch.equal(model.eval()(x[:, 6:], mems).logits, plain(x[:, 6:], mems).logits)
    model.train()
    torch.manual_seed(3)
    dropped = torch.rand(2, mems.length) < 0.5  # the draw the policy makes first in the forward
    assert dropped.any() and not dropped.all()
    torch.manual_seed(3)
    trained = model(x[:, 6:], mems).logits
    cleared = replace(mems, doc_ids=torch.where(dropped, -1, 0))  # dropped slots as a cleared document's
    reference = plain(x[:, 6:], cleared, doc_ids=torch.zeros(2, 6, dtype=torch.long)).logits
    torch.testing.assert_close(trained, reference, rtol=0, atol=1e-12)
    torch.manual_seed(4)
    assert not torch.allclose(model(x[:, 6:], mems).logits, trained)  # a new draw every forward


def test_memory_state_round_trips_through_checkpoint_tensors():
    model = model_for(cmem_len=4, cmem_rate=2, mem_quant="int8").eval()
    x = torch.randint(0, 40, (2, 24))
    mems = None
    for lo in range(0, 24, 6):
        mems = model(x[:, lo : lo + 6], mems).mems
    again = Memory.from_tensors(mems.to_tensors())
    out_a, out_b = model(x[:, :6], mems).logits, model(x[:, :6], again).logits
    assert torch.equal(out_a, out_b)


def test_attention_pruning_keeps_the_segment_and_the_most_attended_old_slots():
    from longseq.model.attention import causal_mask, key_mass

    recent = model_for(mem_len=8).eval()
    pruned = model_for(mem_len=8, mem_select="attention").eval()
    x = torch.randint(0, 40, (2, 16))
    first = recent(x[:, :6]).mems  # memory not full yet: nothing to choose
    assert torch.equal(pruned(x[:, :6]).mems[0], first[0])
    state = pruned(x[:, 6:11], first).mems  # 6 old + 5 new > 8: keep 3 old slots and the 5 new
    layer0 = state[0]
    embedded = recent.transformer.word_emb(x[:, 6:11])
    assert torch.equal(layer0[:, 3:], embedded)
    # the 3 old slots are those of layer 0 that received the most attention mass, in their original order
    attn = recent.transformer.stack.layers[0].dec_attn
    context = torch.cat([first[0], embedded], dim=1)
    q, k, _ = attn.qkv_net(context).split(16, dim=-1)
    q = q[:, -5:].reshape(2, 5, 2, 8).transpose(1, 2)
    k = k.reshape(2, 11, 2, 8).transpose(1, 2)
    rel = recent.transformer.stack.relative_tables(11, -1, torch.float32, x.device)[0]
    mass = key_mass(
        q, k, rel, recent.transformer.stack.r_w_bias, recent.transformer.stack.r_r_bias, causal_mask(5, 6, None)
    )[:, :6]
    chosen = mass.topk(3, dim=1).indices.sort(dim=1).values
    expected = first[0].gather(1, chosen[:, :, None].expand(-1, -1, 16))
    assert torch.allclose(layer0[:, :3], expected, atol=1e-6)


def test_memory_tokens_carry_state_and_backpropagate_through_the_window():
    x = torch.randint(0, 40, (2, 18))
    for bptt, reaches_back in ((1, False), (2, True)):
        model = model_for(mem_tokens=3, mem_tokens_bptt=bptt).train()
        captured = []
        handle = model.transformer.word_emb.register_forward_hook(lambda m, a, out, store=captured: store.append(out))
        first = model(x[:, :6], None, x[:, 1:7])
        assert first.mems.tokens.shape == (2, 3, 16) and first.mems.mem_length == 6
        second = model(x[:, 6:12], first.mems, x[:, 7:13])
        handle.remove()
        (grad,) = torch.autograd.grad(second.loss, [captured[0]], allow_unused=True)
        assert (grad is not None) == reaches_back  # through the memory tokens only: the XL memory is detached
    model.eval()
    out = model(x[:, :6])
    assert out.logits.shape == (2, 6, 40) and not out.mems.tokens.requires_grad


def test_memory_tokens_and_compaction_resume_exactly(tmp_path):
    from support import tiny_corpus, tiny_run

    from longseq.api import train

    corpus = tiny_corpus()

    def run():
        r = tiny_run(max_steps=8, eval_interval=4)
        r.model = ModelConfig(
            **{
                **r.model.to_dict(),
                "mem_tokens": 2,
                "mem_tokens_bptt": 2,
                "cmem_len": 4,
                "cmem_rate": 2,
                "cmem_fn": "linear",
                "mem_quant": "int8",
            }
        )
        r.data.varlen = False
        return r

    whole = train(run(), str(tmp_path / "whole"), corpus=corpus, progress=False)
    first = train(run(), str(tmp_path / "split"), corpus=corpus, progress=False, stop_after=3)
    second = train(run(), str(tmp_path / "split"), corpus=corpus, progress=False, resume=True)
    assert first.losses + second.losses == whole.losses and len(whole.losses) == 8
    assert whole.tokens == 8 * 2 * 4 * 8  # two segments per step with mem_tokens_bptt=2


def test_reset_rows_with_memory_tokens_restarts_those_streams():
    model = model_for(mem_tokens=2).double().eval()
    first, second = torch.randint(0, 40, (2, 6)), torch.randint(0, 40, (2, 5))
    mems = model(first).mems
    with pytest.raises(ValueError, match="initial_tokens"):
        reset_rows(mems, torch.tensor([True, False]))
    cleared = reset_rows(mems, torch.tensor([True, False]), model.transformer.stack.memory_tokens)
    after = model(second, cleared).logits
    assert torch.allclose(after[0], model(second[:1]).logits[0], atol=1e-10)
    assert torch.allclose(after[1], model(second, mems).logits[1], atol=1e-10)


def test_document_ids_work_with_chunked_attention_and_bad_combinations_are_rejected():
    chunked = model_for(attn_chunk=3).double().eval()
    whole = model_for(attn_chunk=0).double().eval()
    x, docs = torch.randint(0, 40, (2, 10)), torch.tensor([[0] * 4 + [1] * 6, [2] * 10])
    first_c, first_w = chunked(x, doc_ids=docs), whole(x, doc_ids=docs)
    assert torch.allclose(first_c.logits, first_w.logits, atol=1e-12)
    assert torch.allclose(
        chunked(x, first_c.mems, doc_ids=docs + 1).logits, whole(x, first_w.mems, doc_ids=docs + 1).logits, atol=1e-12
    )
    with pytest.raises(ConfigError, match="cannot be combined with a compressed memory"):
        ModelConfig(mem_select="attention", cmem_len=4, cmem_rate=2)
    pruned = model_for(mem_select="attention")
    with pytest.raises(ValueError, match="does not support document ids"):
        pruned(x, doc_ids=docs)
