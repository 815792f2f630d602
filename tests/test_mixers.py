"""State-space, convolution and RNN layers whose state is carried like the XL memory: each fast form equals its
step-by-step reference, chunked with state equals whole, causality, document resets, exact resume, generation."""

import math

import pytest
import torch
from support import assert_resumes_exactly, in_segments, segments_and_steps, tiny_run

from longseq import ModelConfig, TransformerXLLM
from longseq.model import Memory, RingMemory
from longseq.model.mixers import MIXERS
from longseq.model.mixers.conv import causal_conv, conv_reference
from longseq.model.mixers.rnn import lstm_reference
from longseq.model.mixers.ssd import ssd_chunked, ssd_reference

SMALL = dict(vocab_size=30, n_layer=4, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, head_dim=8,
             d_state=4, chunk=4, conv_kernel=3)  # fmt: skip


def docs_for(batch: int, length: int):
    """Two streams: the first changes document at position 5 (and continues the previous segment's), the second
    starts a new document at position 0."""
    query = torch.zeros(batch, length, dtype=torch.long)
    query[0, 5:] = 1
    query[1] = 3
    return query, torch.tensor([0, 2])


def grads(outputs, tensors):
    loss = sum((o.double() * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o)).sum() for o in outputs)
    return torch.autograd.grad(loss, tensors, retain_graph=True)


@pytest.mark.parametrize("with_docs", [False, True])
def test_the_chunked_scan_equals_the_step_by_step_recurrence(with_docs):
    torch.manual_seed(0)
    batch, length, heads, p, n = 2, 19, 3, 4, 5
    x = torch.randn(batch, length, heads, p, dtype=torch.float64, requires_grad=True)
    a_raw = (-torch.rand(batch, length, heads, dtype=torch.float64)).requires_grad_()
    b = torch.randn(batch, length, heads, n, dtype=torch.float64, requires_grad=True)
    c = torch.randn(batch, length, heads, n, dtype=torch.float64, requires_grad=True)
    state = torch.randn(batch, heads, p, n, dtype=torch.float64, requires_grad=True)
    a = a_raw
    if with_docs:  # a document starts at position 10 of the first stream: its decay is exp(-inf) = 0
        a = a_raw.masked_fill(torch.zeros_like(a_raw, dtype=torch.bool).index_fill_(1, torch.tensor([10]), True)
                              & (torch.arange(batch)[:, None, None] == 0), float("-inf"))  # fmt: skip
    reference = ssd_reference(x, a, b, c, state)
    chunked = ssd_chunked(x, a, b, c, 4, state, boundaries=with_docs)
    for r, f in zip(reference, chunked):
        torch.testing.assert_close(f, r, rtol=0, atol=1e-10)
    inputs = (x, a_raw, b, c, state)
    for g_ref, g_fast in zip(grads(reference, inputs), grads(chunked, inputs)):
        torch.testing.assert_close(g_fast, g_ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("with_docs", [False, True])
def test_the_causal_convolution_equals_its_loop(with_docs):
    torch.manual_seed(1)
    u = torch.randn(2, 9, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, dtype=torch.float64, requires_grad=True)
    tail = torch.randn(2, 2, 6, dtype=torch.float64, requires_grad=True)
    docs = docs_for(2, 9) if with_docs else None
    fast, _ = causal_conv(u, weight, bias, tail, docs)
    slow = conv_reference(u, weight, bias, tail, docs)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    for g_fast, g_slow in zip(grads([fast], (u, weight, bias, tail)), grads([slow], (u, weight, bias, tail))):
        torch.testing.assert_close(g_fast, g_slow, rtol=0, atol=1e-12)


@pytest.mark.parametrize("with_docs", [False, True])
def test_the_lstm_mixer_equals_its_gates_written_out(with_docs):
    torch.manual_seed(2)
    mixer = MIXERS["rnn"].build(ModelConfig(**SMALL)).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    state = (torch.randn(2, 16, dtype=torch.float64), torch.randn(2, 16, dtype=torch.float64))
    docs = docs_for(2, 9) if with_docs else None
    out, (h, c) = mixer(x, state, docs)
    ref, (h_ref, c_ref) = lstm_reference(mixer.lstm, x, state, docs)
    for a, b in ((out, ref), (h, h_ref), (c, c_ref)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    params = [x, *mixer.parameters()]
    for g_fast, g_slow in zip(grads([out, h, c], params), grads([ref, h_ref, c_ref], params)):
        torch.testing.assert_close(g_fast, g_slow, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["ssm", "conv", "rnn"])
def test_each_mixer_run_whole_equals_it_run_token_by_token_with_its_state(name):
    """The parallel (chunked) form over a whole sequence equals the recurrence fed one position at a time, in
    float64, outputs and gradients; for the ssm also its own scan written step by step."""
    torch.manual_seed(3)
    mixer = MIXERS[name].build(ModelConfig(**SMALL)).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64, requires_grad=True)
    whole, final = mixer(x, None)
    state, steps = None, []
    for t in range(11):
        out, state = mixer(x[:, t : t + 1], state)
        steps.append(out)
    stepped = torch.cat(steps, dim=1)
    torch.testing.assert_close(stepped, whole, rtol=0, atol=1e-10)
    for a, b in zip(state, final):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    params = [x, *mixer.parameters()]
    for g_whole, g_steps in zip(grads([whole], params), grads([stepped], params)):
        torch.testing.assert_close(g_whole, g_steps, rtol=0, atol=1e-10)
    if name == "ssm":
        mixer.scan = "reference"
        reference, _ = mixer(x, None)
        torch.testing.assert_close(reference, whole, rtol=0, atol=1e-10)


def hybrid(**extra):
    torch.manual_seed(4)
    config = ModelConfig(**{**SMALL, "mixer": ["ssm", "attention", "conv", "rnn"], "mem_len": 24, **extra})
    return TransformerXLLM(config).eval()


@pytest.mark.parametrize(
    "overrides",
    [
        *({"mixer": [name]} for name in MIXERS),
        {"mixer": ["linear"], "reset_every": 8},
        {"mixer": ["performer"], "rotary": True, "short_conv": ["performer"]},
        {"mixer": ["retention", "gla", "retention", "gla"], "short_conv": ["retention", "gla"]},
        {"mixer": ["delta"], "short_conv": []},
    ],
)
def test_each_mixer_declares_the_shapes_of_the_state_it_returns(overrides):
    """What the stack holds a memory to (a memory of another model is refused by name): the shapes each mixer
    declares are those of the state it returns."""
    model = TransformerXLLM(ModelConfig(**{**SMALL, "mem_len": 0, **overrides})).eval()
    memory = model(torch.randint(0, 30, (3, 6))).mems
    for layer, state in zip(model.transformer.stack.layers, memory.layers):
        assert tuple(tuple(t.shape) for t in state.tensors) == tuple((3, *s) for s in layer.mixer.state_shapes())


def test_a_hybrid_stack_read_in_segments_with_memory_equals_the_whole_sequence():
    model = hybrid()
    x = torch.randint(0, 30, (2, 24))
    with torch.no_grad():
        whole = model(x).logits
        segmented, mems = in_segments(model, x, 5)  # 5, 5, 5, 5, 4: segments that cut through the ssm's chunks
    torch.testing.assert_close(segmented, whole, rtol=0, atol=1e-5)
    assert len(mems[0]) == 2 and len(mems[2]) == 1 and len(mems[3]) == 2  # ssm, conv and rnn states
    assert mems[1].shape == (2, 24, 16)  # the attention layer's memory


@pytest.mark.parametrize("mixer", ["ssm", "conv", "rnn"])
def test_changing_a_later_token_changes_no_earlier_output(mixer):
    torch.manual_seed(5)
    model = TransformerXLLM(ModelConfig(**{**SMALL, "mixer": [mixer], "mem_len": 0})).double().eval()
    x = torch.randint(0, 30, (1, 12))
    for t in (0, 5, 10):
        y = x.clone()
        y[0, t + 1] = (y[0, t + 1] + 1) % 30
        a, b = model(x).logits, model(y).logits
        torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=0)
        assert not torch.allclose(a[:, t + 1], b[:, t + 1])


def test_after_a_document_boundary_the_output_does_not_depend_on_the_previous_document():
    model = hybrid(mem_len=8).double()
    first = torch.randint(0, 30, (1, 6))
    second = torch.randint(0, 30, (1, 7))
    docs = torch.tensor([[0] * 6 + [1] * 7])
    with torch.no_grad():
        joined = model(torch.cat([first, second], dim=1), doc_ids=docs).logits[:, 6:]
        alone = model(second).logits
        other = model(torch.cat([torch.randint(0, 30, (1, 6)), second], dim=1), doc_ids=docs).logits[:, 6:]
    torch.testing.assert_close(joined, alone, rtol=0, atol=1e-10)
    torch.testing.assert_close(other, alone, rtol=0, atol=1e-10)
    with torch.no_grad():  # and across segments: the boundary falls between two calls
        mems = model(first, doc_ids=docs[:, :6]).mems
        continued = model(second, mems, doc_ids=docs[:, 6:]).logits
    torch.testing.assert_close(continued, alone, rtol=0, atol=1e-10)


def test_generation_with_state_equals_a_full_forward():
    """Token by token through a ring memory (attention) and carried states (mixers): each step's scores equal
    those of the whole sequence read at once."""
    model = hybrid(mem_len=40).double()
    x = torch.randint(0, 30, (2, 15))
    with torch.no_grad():
        whole = model(x).logits
        mems, steps = Memory.empty(RingMemory), []
        for t in range(15):
            scores, mems = model.next_token_scores(x[:, t : t + 1], mems)
            steps.append(scores)
    torch.testing.assert_close(torch.stack(steps, dim=1), whole, rtol=0, atol=1e-10)


def test_training_with_every_mixer_resumes_bit_for_bit(tmp_path):
    def run():
        config = tiny_run(max_steps=10, eval_interval=5, grad_accum=2)
        model = config.model.to_dict()
        model.update(mixer=["ssm", "attention", "conv", "rnn"], n_layer=4)
        model["mixers"].update(head_dim=8, d_state=4, chunk=4, conv_kernel=3)
        config.model = ModelConfig.from_dict(model)
        return config

    assert_resumes_exactly(run, tmp_path, stop_after=4)


def test_state_bptt_back_propagates_through_that_many_segments():
    """With state_bptt=2 the loss of a segment reaches the ssm's parameters through the previous segment's state;
    with 1 the state arrives detached."""
    torch.manual_seed(6)
    for bptt, reaches in ((1, False), (2, True)):
        model = TransformerXLLM(ModelConfig(**{**SMALL, "mixer": ["ssm"], "mem_len": 0, "state_bptt": bptt})).train()
        x = torch.randint(0, 30, (2, 12))
        first = model(x[:, :6], None, x[:, 1:7])
        second = model(x[:, 6:11], first.mems, x[:, 7:12])
        assert first.mems[0][1].requires_grad == reaches
        if reaches:
            torch.autograd.grad(second.loss, [first.mems[0][1]])  # the graph goes back through the state


def hourglass(factor: int, **extra):
    torch.manual_seed(7)
    config = ModelConfig(**{**SMALL, "mixer": ["attention", "ssm", "attention", "conv"], "mem_len": 48,
                               "shorten_layers": [1, 3], "shorten_factor": factor, **extra})  # fmt: skip
    return TransformerXLLM(config).double().eval()


@pytest.mark.parametrize("factor", [2, 3, 4])
def test_the_hourglass_is_causal_at_every_shortening_factor(factor):
    """Shortening is where leaks hide: changing token t + 1 changes no output at or before t, for every t."""
    model = hourglass(factor)
    x = torch.randint(0, 30, (2, 17))
    with torch.no_grad():
        base = model(x).logits
        for t in range(16):
            y = x.clone()
            y[:, t + 1] = (y[:, t + 1] + 1) % 30
            torch.testing.assert_close(model(y).logits[:, : t + 1], base[:, : t + 1], rtol=0, atol=0)


@pytest.mark.parametrize("factor", [2, 3])
def test_the_hourglass_keeps_the_xl_memory_at_each_resolution(factor):
    """Segments of 5 (which cut through the groups), token-by-token generation and the whole sequence agree; with
    documents, the previous document's content changes nothing after the boundary, across segments too."""
    model = hourglass(factor)
    x = torch.randint(0, 30, (2, 23))
    docs = torch.tensor([[0] * 9 + [1] * 14, [0] * 9 + [1] * 14])
    with torch.no_grad():
        whole = model(x).logits
        segmented, stepped, _ = segments_and_steps(model, x, 5)
        other = x.clone()
        other[:, :9] = torch.randint(0, 30, (2, 9))
        first = model(x[:, :7], doc_ids=docs[:, :7]).mems
        continued = model(x[:, 7:], first, doc_ids=docs[:, 7:]).logits[:, 2:]
        replaced = model(other, doc_ids=docs).logits[:, 9:]
    torch.testing.assert_close(segmented, whole, rtol=0, atol=1e-10)
    torch.testing.assert_close(stepped, whole, rtol=0, atol=1e-10)
    torch.testing.assert_close(continued, replaced, rtol=0, atol=1e-10)


def test_training_an_hourglass_resumes_bit_for_bit(tmp_path):
    def run():
        config = tiny_run(max_steps=8, eval_interval=4, grad_accum=2)
        model = config.model.to_dict()
        model.update(n_layer=3)
        model["hourglass"].update(shorten_layers=[1, 2], shorten_factor=2)
        config.model = ModelConfig.from_dict(model)
        return config

    assert_resumes_exactly(run, tmp_path, stop_after=3)


def test_the_model_initialisation_keeps_each_mixer_its_own_and_the_mixers_mix():
    """The model's pass (normal(0, 0.02) for every weight, 0 for every bias) overwrote Mamba's A, dt, D and norm
    scale and the convolution's taps, and left the gated projections so small that a token changed the logits 1 to
    3 positions later by 3e-7 (ssm) and 5e-6 (conv): those layers started as position-wise feed-forwards."""
    torch.manual_seed(0)
    config = ModelConfig(**{**SMALL, "mixer": ["ssm", "conv", "rnn", "ssm"], "mem_len": 0, "dropout": 0.0})
    model = TransformerXLLM(config).eval().requires_grad_(False)  # the parameters are read as numbers here
    ssm, conv, rnn = (model.transformer.stack.layers[i].mixer for i in range(3))
    heads = ssm.A_log.numel()
    torch.testing.assert_close(ssm.A_log.exp(), torch.exp(torch.linspace(0, math.log(16), heads)))
    dt = torch.nn.functional.softplus(ssm.dt_bias)
    assert 0.9e-3 <= float(dt.min()) and float(dt.max()) <= 0.11
    assert bool((ssm.D == 1).all()) and bool((ssm.norm.weight == 1).all())
    taps = conv.conv_weight.size(1)
    assert 0.5 * taps**-0.5 < float(conv.conv_weight.std()) < 1.5 * taps**-0.5
    bound = rnn.lstm.hidden_size**-0.5
    assert float(rnn.lstm.weight_hh_l0.abs().max()) <= bound and float(rnn.lstm.weight_hh_l0.std()) > bound / 3
    for mixer in ("ssm", "conv"):  # one mixer alone: a token reaches the next positions through it
        torch.manual_seed(0)
        model = TransformerXLLM(ModelConfig(**{**SMALL, "mixer": [mixer], "mem_len": 0, "dropout": 0.0})).eval()
        x = torch.randint(0, 30, (1, 16))
        y = x.clone()
        y[0, 5] = (y[0, 5] + 1) % 30
        with torch.no_grad():
            change = (model(x).logits - model(y).logits).abs().amax(-1)[0, 6:9]  # 1 to 3 positions later
        assert float(change.max()) > 1e-3, (mixer, change)


def test_memory_settings_on_a_stack_without_attention_are_refused_by_eval_and_generate(tmp_path, capsys):
    """``generate --mem-len`` and ``eval --set mem_len`` on an ssm checkpoint were accepted and did nothing (the
    recurrent state carries the whole past), while ``train`` refuses them."""
    from longseq.cli import main
    from longseq.config import DataConfig, RunConfig, TrainConfig
    from longseq.data.tokenizers import ByteTokenizer
    from longseq.train.checkpoint import save_checkpoint

    (tmp_path / "c.txt").write_text("some text to score, read in segments.\n" * 40)
    config = ModelConfig(**{**SMALL, "vocab_size": 256, "mixer": ["ssm"], "mem_len": 0})
    run = RunConfig(config, DataConfig(path=str(tmp_path / "c.txt"), tokenizer="byte", tgt_len=8, eval_tgt_len=8,
                                       eval_batch_size=2), TrainConfig())  # fmt: skip
    save_checkpoint(str(tmp_path / "ssm"), TransformerXLLM(config), run, ByteTokenizer())
    ck = ["--checkpoint", str(tmp_path / "ssm")]
    for argv, flag in ((["eval", *ck, "--set", "mem_len=64"], "--set mem_len"),
                       (["eval", *ck, "--set", "same_length=true"], "--set same_length"),
                       (["generate", *ck, "--prompt", "so", "--max-new-tokens", "3", "--mem-len", "99"], "--mem-len")):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert flag in err and "mixer=ssm" in err and "no attention layer" in err, err
    assert (
        main(["eval", *ck, "--quiet"]) == 0 and main(["generate", *ck, "--prompt", "so", "--max-new-tokens", "3"]) == 0
    )
