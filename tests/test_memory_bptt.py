"""Back-propagation through the XL memory (``mem_bptt``): the gradient of segments read with the memory equals the
gradient of the whole sequence read at once; the default stays the paper's stop-gradient; the memory is cut every
``mem_bptt`` segments; bad combinations are refused by name; a run with it resumes exactly."""

import pytest
import torch

from longseq import ModelConfig
from longseq.config.base import ConfigError
from longseq.model import TransformerXLLM
from longseq.model.heads import DocumentClassifier, read_segments

T = 6  # segment length
SMALL = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, cutoffs=[])


def lm(mem_bptt: int, mem_len: int = 2 * T, **extra) -> TransformerXLLM:
    torch.manual_seed(0)
    config = ModelConfig(**SMALL, mem_len=mem_len, mem_bptt=mem_bptt, **extra)
    return TransformerXLLM(config).double().train()


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_two_segments_with_mem_bptt_have_the_gradient_of_the_whole_sequence():
    """Loss of segment 1 + loss of segment 2 read with the memory, gradient kept through it, equals the loss of
    the 2T tokens read as one segment, to float64 precision, parameter by parameter; with stop-gradient
    (mem_bptt=1) the forward is the same but the gradient is not."""
    x = torch.randint(0, 30, (3, 2 * T + 1))
    inputs, labels = x[:, :-1], x[:, 1:]
    reference = lm(1)
    reference(inputs, None, labels).loss.backward()
    whole = grads(reference)
    for bptt, equal in ((2, True), (1, False)):
        model = lm(bptt)
        first = model(inputs[:, :T], None, labels[:, :T])
        second = model(inputs[:, T:], first.mems, labels[:, T:])
        ((first.loss + second.loss) / 2).backward()
        chunked = grads(model)
        assert chunked.keys() == whole.keys()
        close = [torch.allclose(chunked[n], whole[n], rtol=0, atol=1e-10) for n in whole]
        assert all(close) if equal else not all(close)
        assert second.mems[0].requires_grad == equal  # the new memory carries the graph only with mem_bptt


def lm_step(model: TransformerXLLM, x: torch.Tensor, accum: int):
    """One training step of the LM task over ``x`` (B, 2T + 1) read as two segments of T, ``accum`` row chunks."""
    from longseq.config.run import DataConfig, RunConfig, TrainConfig
    from longseq.data.batching import Segment
    from longseq.tasks.base import StepContext
    from longseq.tasks.lm import LanguageModeling

    run = RunConfig(model=model.config, data=DataConfig(tgt_len=T, batch_size=x.size(0)), train=TrainConfig())
    segments = [
        Segment(x[:, i : i + T], x[:, i + 1 : i + T + 1], new_epoch=False, first=torch.full((x.size(0),), i))
        for i in (0, T)
    ]
    ctx = StepContext(net=model, device=torch.device("cpu"), rows=slice(None), grad_accum=accum)
    return LanguageModeling(run).train_step(ctx, segments, None)


@pytest.mark.parametrize("accum", [1, 2])
def test_a_language_model_step_with_mem_bptt_has_the_gradient_of_the_whole_window(accum):
    """The training step of the LM task (two segments, gradient accumulation in row chunks) gives the parameter
    gradients of the 2T tokens read as one segment."""
    x = torch.randint(0, 30, (4, 2 * T + 1))
    reference = lm(1)
    reference(x[:, :-1], None, x[:, 1:]).loss.backward()
    whole = grads(reference)
    model = lm(2)
    result = lm_step(model, x, accum)
    stepped = grads(model)
    assert all(torch.allclose(stepped[n], whole[n], rtol=0, atol=1e-10) for n in whole)
    assert not result.memory[0].requires_grad  # the memory carried to the next step is cut


def test_gradient_accumulation_bounds_the_graph_held_at_once_with_mem_bptt():
    """With a window of 2 segments, grad_accum=2 holds at most a little over half the activations that grad_accum=1
    holds: each row chunk goes through the whole window and its backward before the next chunk starts.  Measured
    as the largest number of saved activation values (parameters left out) alive at once during the step."""
    import weakref

    class Saved:
        __slots__ = ("tensor", "__weakref__")

    x = torch.randint(0, 30, (8, 2 * T + 1))

    def peak(accum: int) -> int:
        model = lm(2)
        weights = {p.data_ptr() for p in model.parameters()}
        live, most = weakref.WeakSet(), [0]

        def pack(tensor):
            box = Saved()
            box.tensor = tensor
            if tensor.data_ptr() not in weights:
                live.add(box)
                most[0] = max(most[0], sum(b.tensor.numel() for b in live))
            return box

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda box: box.tensor):
            lm_step(model, x, accum)
        return most[0]

    whole, halves = peak(1), peak(2)
    assert halves <= 0.6 * whole, (halves, whole)


def test_eval_memory_is_detached_whatever_mem_bptt_says():
    model = lm(4).eval()
    out = model(torch.randint(0, 30, (2, T)))
    assert not out.mems[0].requires_grad


def token_grad(classifier: DocumentClassifier, doc: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The gradient of the classification loss with respect to the embedding of every token of ``doc``."""
    captured = []
    emb = classifier.lm.transformer.word_emb

    def keep(module, args, out):
        if out.requires_grad:  # a segment read without a graph has no gradient
            out.retain_grad()
        captured.append(out)

    handle = emb.register_forward_hook(keep)
    classifier(doc, T, labels)["loss"].backward()
    handle.remove()
    per_token = [torch.zeros(c.shape[:2]) if c.grad is None else c.grad.abs().sum(-1) for c in captured]
    return torch.cat(per_token, dim=1)  # (B, N): one value per token


@pytest.mark.parametrize("bptt", [1, 2, 3])
def test_a_classifier_trains_its_last_mem_bptt_segments(bptt):
    """Three segments: the classifier's gradient reaches the tokens of exactly the last ``bptt`` segments, and with
    all three it equals the gradient of the document read as one segment."""
    torch.manual_seed(1)
    doc, labels = torch.randint(0, 30, (2, 3 * T)), torch.tensor([0, 2])
    classifier = DocumentClassifier(lm(bptt), 3, pooling="last").double()
    reached = token_grad(classifier, doc, labels).sum(0) > 0  # (N,)
    assert reached.tolist() == [i >= (3 - bptt) * T for i in range(3 * T)]
    if bptt == 3:
        chunked = grads(classifier)
        classifier.zero_grad()
        classifier(doc, 3 * T, labels)["loss"].backward()  # the whole document in one segment
        whole = grads(classifier)
        assert all(torch.allclose(chunked[n], whole[n], rtol=0, atol=1e-10) for n in whole)


def test_document_pooling_trains_every_segment_with_a_stop_gradient_memory():
    torch.manual_seed(1)
    doc, labels = torch.randint(0, 30, (2, 3 * T)), torch.tensor([0, 2])
    classifier = DocumentClassifier(lm(1), 3, pooling="document").double()
    assert bool((token_grad(classifier, doc, labels).sum(0) > 0).all())


@pytest.mark.parametrize("bptt, reached", [(1, [2]), (2, [1, 2]), (4, [0, 1, 2])])
def test_the_reader_cuts_the_memory_into_blocks_counted_back_from_the_end(bptt, reached):
    """Every segment keeps its graph (the span and masked-LM heads' reading): the last segment's output reaches
    back exactly to the start of its block of ``bptt`` segments, however many segments the document has."""
    model = lm(bptt)
    captured = []
    handle = model.transformer.word_emb.register_forward_hook(lambda m, a, out: captured.append(out))
    last = [read.hidden for read in read_segments(model, torch.randint(0, 30, (2, 3 * T)), T)][-1]
    handle.remove()
    found = torch.autograd.grad(last.sum(), captured, allow_unused=True)
    assert [i for i, g in enumerate(found) if g is not None and bool(g.abs().sum() > 0)] == reached


def test_a_language_model_step_reads_mem_bptt_segments():
    config = ModelConfig(**SMALL, mem_len=8, mem_bptt=3)
    assert config.segments_per_step == 3
    assert ModelConfig(**SMALL, mem_len=8).segments_per_step == 1


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(mem_len=0, mem_bptt=2), "mem_len >= 1"),
        (dict(mem_len=8, mem_bptt=2, mem_quant="int8"), "mem_quant"),
        (dict(mem_len=8, mem_bptt=2, mem_select="attention"), "mem_select"),
        (dict(mem_len=8, mem_bptt=2, arch="lstm"), "arch=lstm"),
        (dict(mem_len=8, mem_bptt=2, n_layer=4, shorten_layers=[1, 3]), "shorten_layers"),
        (dict(mem_len=8, mem_bptt=0), "mem_bptt must be >= 1"),
        (dict(mem_len=8, mem_bptt=2, cmem_len=4, cmem_rate=2), "cmem_len"),
        (dict(mem_len=8, mem_bptt=2, mem_tokens=2, mem_tokens_bptt=3), "mem_tokens_bptt=3"),
        (dict(mem_len=8, mem_bptt=2, mixer=["ssm"]), "without attention layers"),
        (dict(mem_len=8, mem_bptt=2, mixer="ssm,attention", state_bptt=3), "state_bptt=3"),
    ],
)
def test_mem_bptt_refuses_what_carries_no_gradient(fields, named):
    with pytest.raises(ConfigError, match="mem_bptt") as error:
        ModelConfig(**{**SMALL, **fields})
    assert named in str(error.value)


def test_a_run_with_mem_bptt_resumes_exactly(tmp_path):
    from support import assert_resumes_exactly, tiny_run

    def run():
        r = tiny_run(max_steps=6, eval_interval=3)
        r.model = ModelConfig(**{**r.model.to_dict(), "mem_bptt": 2})
        r.data.varlen = False
        return r

    whole = assert_resumes_exactly(run, tmp_path, stop_after=2)
    assert len(whole.losses) == 6
    assert whole.tokens == 6 * 2 * run().data.batch_size * run().data.tgt_len  # two segments a step
