"""Learned segmentation: a dynamic hourglass whose chunks a boundary predictor chooses (``boundaries=learned``,
H-Net's routing; ``boundaries=entropy``, BLT's entropy patches), with an XL memory of chunks.

Claims: no position's prediction (nor boundary) depends on a later token; segments with both memories carried and
token-by-token generation equal the whole sequence in one pass (float64); the boundaries are the same read whole
or in segments; each row of a batch reads as it would alone, with a coarse memory that truncates to ``mem_len``
chunks; a new document reads nothing of the previous one; the smoothing's scan equals its loop; the ratio loss is
its formula and the model adds it; the entropy threshold settles on the quantile that gives the target chunk
length; the length bound (``max_chunk``) equals its loop and cuts flat-entropy text every M positions, read whole
or in segments; training resumes bit for bit; bad options are refused by name."""

import json

import pytest
import torch
from support import assert_resumes_exactly, in_segments, raises_naming, rewrite_listed, segments_and_steps, tiny_run

from longseq import ModelConfig, TransformerXLLM
from longseq.config import ConfigError
from longseq.diagnostics.chunks import chunk_statistics, read_boundaries
from longseq.model.boundaries import (
    BOUNDARY_PREDICTORS,
    EntropyCut,
    limit_length,
    limit_length_reference,
    ratio_loss,
    smooth,
    smooth_reference,
)
from longseq.model.registry import build_model, ignored_options

SMALL = dict(vocab_size=30, n_layer=4, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0)
PREDICTORS = {  # every registered predictor (entropy: the relative rule, its default), and the global rule
    **{name: dict(boundaries=name) for name in BOUNDARY_PREDICTORS},
    "entropy-global": dict(boundaries="entropy", entropy_rule="global"),
    "entropy-max": dict(boundaries="entropy", max_chunk=4),  # a length bound, carried across segments
    "learned-max": dict(boundaries="learned", max_chunk=3),
}


def dynamic(name: str, mem_len: int = 48, seed: int = 7, **extra) -> TransformerXLLM:
    torch.manual_seed(seed)
    config = ModelConfig(**{**SMALL, "mem_len": mem_len, "shorten_layers": [1, 3], "shorten_factor": 3,
                            **PREDICTORS[name], **extra})  # fmt: skip
    model = TransformerXLLM(config).double().eval()
    if name.startswith("entropy"):  # a head that is sure of some tokens and not of others, so the entropy varies
        with torch.no_grad():
            model.transformer.stack.layers[1].boundaries.head.weight.normal_(0, 1.0)
    return model


def recorded_cuts(model: TransformerXLLM) -> tuple[list, object]:
    """A list that every call of the model's boundary predictor appends its decision (a ``Cut``) to, and the hook."""
    cuts = []
    hook = model.transformer.stack.layers[1].boundaries.register_forward_hook(
        lambda module, args, out: cuts.append(out)
    )
    return cuts, hook


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_no_prediction_and_no_boundary_depends_on_a_later_token(name):
    model = dynamic(name)
    x = torch.randint(0, 30, (3, 17))
    cuts, _ = recorded_cuts(model)
    with torch.no_grad():
        base = model(x).logits
        base_cuts = cuts[-1].cuts
        for t in range(16):
            y = x.clone()
            y[:, t + 1] = (y[:, t + 1] + 1) % 30
            torch.testing.assert_close(model(y).logits[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-12)
            assert torch.equal(cuts[-1].cuts[:, : t + 1], base_cuts[:, : t + 1])
    counts = base_cuts.sum(1)
    assert bool((counts > 2).all()) and bool((counts < 15).all())  # the test cuts: neither every position nor none


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_segments_and_token_by_token_generation_equal_the_whole_pass(name):
    """Segments of 5 (chunks span segments) with the byte and chunk memories carried, and one token at a time
    through a ring memory (generation's path), against one pass over the whole sequence; the boundaries too."""
    model = dynamic(name)
    x = torch.randint(0, 30, (3, 23))
    cuts, _ = recorded_cuts(model)
    with torch.no_grad():
        whole = model(x).logits
        whole_cuts = cuts[-1].cuts
        cuts.clear()
        segmented, stepped, _ = segments_and_steps(model, x, 5)
    read_in_segments = torch.cat([c.cuts for c in cuts[:5]], dim=1)
    one_at_a_time = torch.cat([c.cuts for c in cuts[5:]], dim=1)
    assert torch.equal(read_in_segments, whole_cuts) and torch.equal(one_at_a_time, whole_cuts)
    torch.testing.assert_close(segmented, whole, rtol=0, atol=1e-10)
    torch.testing.assert_close(stepped, whole, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(BOUNDARY_PREDICTORS))
def test_each_row_reads_as_it_would_alone_with_a_coarse_memory_of_mem_len_chunks(name):
    """Rows cut different numbers of chunks, so the batch pads them; with a memory of 4 (bytes, and chunks at the
    coarse level, which truncates) every row's scores are those it gets read alone, and each row's coarse memory
    holds its last 4 chunks (fewer if it cut fewer, the empty slots masked)."""
    model = dynamic(name, mem_len=4)
    x = torch.randint(0, 30, (3, 40))

    cuts, _ = recorded_cuts(model)
    with torch.no_grad():
        batch, mems = in_segments(model, x, 7)
        counts = torch.cat([c.cuts for c in cuts], dim=1).sum(1)
        alone = torch.cat([in_segments(model, x[b : b + 1], 7)[0] for b in range(3)])
    torch.testing.assert_close(batch, alone, rtol=0, atol=1e-10)
    coarse = mems.layers[1].inner
    assert len(set(counts.tolist())) > 1 and int(counts.max()) > 4  # ragged rows, the memory truncates
    assert coarse.mem_length == 4 and torch.equal((coarse.doc_ids >= 0).sum(1), counts.clamp(max=4))


@pytest.mark.parametrize("boundaries", ["fixed", "learned"])
def test_coarse_mem_len_sets_the_shortened_layers_memory_apart_from_mem_len(boundaries):
    """coarse_mem_len at its default's value (fixed: mem_len // k groups; learned: mem_len chunks) changes nothing;
    another value is the number of slots the shortened layers keep, while the full-resolution layers keep mem_len,
    and an evaluation at half the mem_len halves both."""
    extra = {"boundaries": "fixed"} if boundaries == "fixed" else {}
    name = "learned"
    default = dynamic(name, mem_len=6, **extra)
    same = dynamic(name, mem_len=6, coarse_mem_len=2 if boundaries == "fixed" else 6, **extra)
    apart = dynamic(name, mem_len=6, coarse_mem_len=4, **extra)
    x = torch.randint(0, 30, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(same(x).logits, default(x).logits, rtol=0, atol=0)
        mems = apart(x).mems
        half = apart(x, recurrence=apart.config.recurrence(mem_len=3)).mems
    assert mems.mem_length == 6 and mems.layers[1].inner.mem_length == 4
    assert half.mem_length == 3 and half.layers[1].inner.mem_length == 2


def test_a_new_document_reads_nothing_of_the_previous_one():
    """With documents, changing the first document changes nothing after the second begins, read across
    segments; the second document's first position begins a chunk."""
    model = dynamic("learned")
    x = torch.randint(0, 30, (2, 23))
    docs = torch.tensor([[0] * 9 + [1] * 14, [0] * 9 + [1] * 14])
    other = x.clone()
    other[:, :9] = torch.randint(0, 30, (2, 9))
    cuts, _ = recorded_cuts(model)
    with torch.no_grad():
        first = model(x[:, :7], doc_ids=docs[:, :7]).mems
        continued = model(x[:, 7:], first, doc_ids=docs[:, 7:]).logits[:, 2:]
        replaced = model(other, doc_ids=docs).logits[:, 9:]
    torch.testing.assert_close(continued, replaced, rtol=0, atol=1e-10)
    assert bool(cuts[1].cuts[:, 2].all()) and bool((cuts[1].probs[:, 2] == 1).all())


def test_the_smoothing_scan_equals_its_loop():
    """The moving average over 37 chunks (blocks of 16 and a rest), restarted at forced boundaries and continuing
    a carried average, in float64; its gradient too."""
    torch.manual_seed(0)
    outputs = torch.randn(3, 37, 5, dtype=torch.float64, requires_grad=True)
    probs = (0.5 + 0.5 * torch.rand(3, 37, dtype=torch.float64)).requires_grad_()
    carried = torch.randn(3, 5, dtype=torch.float64)
    starts = torch.rand(3, 37) < 0.1
    starts[0, 0] = True
    fast, slow = smooth(outputs, probs, carried, starts), smooth_reference(outputs, probs, carried, starts)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    weights = torch.randn_like(fast)
    grads = [torch.autograd.grad((y * weights).sum(), (outputs, probs)) for y in (fast, slow)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_the_smoothing_in_bfloat16_stays_finite_where_a_probability_rounds_to_one():
    """In bfloat16 1 - 1e-4 is 1, whose log(1 - P) is -inf: the smoothing computes in float32 and stays within
    bfloat16's rounding of the float64 loop."""
    torch.manual_seed(1)
    outputs = torch.randn(2, 20, 4, dtype=torch.float64)
    probs = torch.full((2, 20), 0.99995, dtype=torch.float64)
    probs[:, ::3] = 0.6
    carried, starts = torch.randn(2, 4, dtype=torch.float64), torch.zeros(2, 20, dtype=torch.bool)
    low = smooth(outputs.bfloat16(), probs.bfloat16(), carried.bfloat16(), starts)
    assert low.dtype == torch.bfloat16 and bool(torch.isfinite(low).all())
    torch.testing.assert_close(low.double(), smooth_reference(outputs, probs, carried, starts), rtol=0, atol=0.05)


def test_the_ratio_loss_is_its_formula_and_the_model_adds_it():
    """H-Net's L = N/(N-1) ((N-1) F G + (1-F)(1-G)) on hand-made values; 1 at F = G = 1/N and more elsewhere; and a
    training pass's aux_loss is ratio_loss x the loss of the boundaries it chose."""
    cuts = torch.tensor([[True, False, False, True, False, False, False, True]])
    probs = torch.tensor([[1.0, 0.2, 0.1, 0.7, 0.3, 0.4, 0.0, 0.9]], dtype=torch.float64)
    f, g, n = 3 / 8, 3.6 / 8, 3.0
    assert abs(float(ratio_loss(cuts, probs, 3)) - n / (n - 1) * ((n - 1) * f * g + (1 - f) * (1 - g))) < 1e-15
    for n in (2, 3, 5):
        at = torch.full((1, 10 * n), 1 / n, dtype=torch.float64)
        quarter = torch.zeros(1, 10 * n, dtype=torch.bool)
        quarter[0, ::n] = True
        assert abs(float(ratio_loss(quarter, at, n)) - 1) < 1e-12
        more = torch.ones_like(quarter)
        assert float(ratio_loss(more, torch.ones_like(at), n)) > 1 + 1e-3
    model = dynamic("learned", ratio_loss=0.05).train()
    recorded, _ = recorded_cuts(model)
    x = torch.randint(0, 30, (2, 12))
    out = model(x, labels=x)
    cut = recorded[-1]
    torch.testing.assert_close(out.aux_loss, 0.05 * ratio_loss(cut.cuts, cut.probs, 3), rtol=0, atol=1e-15)
    assert model.eval()(x).aux_loss is None


def test_the_ratio_loss_gradient_moves_the_cut_fraction_to_one_in_n():
    """With F held (the cuts carry no gradient), dL/dp_t = N/(N-1) (N F - 1) / (B T) at every position: the sign
    of F - 1/N.  Descending the ratio loss alone, boundary probabilities that begin with too many cuts (F = 0.6) or
    too few (F = 0.05) end with 1 position in N cut (N = 4)."""
    n, generator = 4, torch.Generator().manual_seed(0)
    for start in (0.6, 0.05):
        cut_first = torch.rand(8, 64, generator=generator, dtype=torch.float64) < start
        logits = torch.where(cut_first, 1.0, -1.0) + 0.3 * torch.randn(8, 64, generator=generator, dtype=torch.float64)
        logits.requires_grad_(True)
        probs = torch.sigmoid(logits)
        cuts = probs >= 0.5
        f = float(cuts.double().mean())
        (grad,) = torch.autograd.grad(ratio_loss(cuts, probs, n), probs)
        torch.testing.assert_close(grad, torch.full_like(grad, n / (n - 1) * (n * f - 1) / grad.numel()))
        optimizer = torch.optim.SGD([logits], lr=100.0)
        for _ in range(200):
            optimizer.zero_grad()
            probs = torch.sigmoid(logits)
            ratio_loss(probs >= 0.5, probs, n).backward()
            optimizer.step()
        assert abs(float((torch.sigmoid(logits) >= 0.5).double().mean()) - 1 / n) < 0.02, start


def test_the_entropy_threshold_settles_on_the_quantile_of_the_target_length():
    """Trained alone by its pinball loss on fixed inputs, the threshold cuts 1 position in N (N = 4)."""
    torch.manual_seed(0)
    predictor = EntropyCut(8, 16, 4, "global").double()
    predictor.init_own_parameters()
    with torch.no_grad():
        predictor.head.weight.normal_(0, 1.0)
    hidden = torch.randn(2, 400, 8, dtype=torch.float64)
    forced, run = torch.zeros(2, 400, dtype=torch.bool), torch.zeros(2, dtype=torch.long)
    optimizer = torch.optim.Adam([predictor.level], lr=0.01)
    for _ in range(300):
        optimizer.zero_grad()
        cut = predictor(hidden, hidden[:, 0], hidden[:, 0, 0], run, forced)
        cut.aux.backward()
        optimizer.step()
    fraction = float(predictor(hidden, hidden[:, 0], hidden[:, 0, 0], run, forced).cuts.double().mean())
    assert 0.22 < fraction < 0.28


@pytest.mark.parametrize("longest", [0, 1, 3, 7])
def test_the_length_limit_equals_its_loop(longest):
    """The vectorised bound (cummax of the last cut, then every ``longest`` positions after it) against the
    position-by-position loop, with carried lengths both below and past the bound."""
    generator = torch.Generator().manual_seed(longest)
    cuts = torch.rand(4, 40, generator=generator) < 0.08
    run = torch.tensor([0, 1, 5, 12])
    if longest:
        run = run.clamp(max=longest)  # a carried length never exceeds the bound that made it
    got, expected = limit_length(cuts, run, longest), limit_length_reference(cuts, run, longest)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    if longest:
        assert bool(got[0].any(1).all())  # every row cut somewhere although the random cuts are rare


def test_where_the_entropy_is_flat_the_bound_cuts_every_max_chunk_positions_read_whole_or_in_segments():
    """A head that predicts nothing (zero weights: every entropy is log V) gives the relative rule no cut after
    the stream's first position; with max_chunk = 5 the chunks begin at 0, 5, 10, ... whether the text is read
    whole or in segments of 7 (the length carried in the state), and the coarse memory then holds chunks."""
    cuts_seen = {}
    for longest in (0, 5):
        model = dynamic("entropy", max_chunk=longest)
        nn_head = model.transformer.stack.layers[1].boundaries.head
        with torch.no_grad():
            nn_head.weight.zero_()
            nn_head.bias.zero_()
        x = torch.randint(0, 30, (2, 28))
        cuts, _ = recorded_cuts(model)
        with torch.no_grad():
            model(x)
            whole = cuts[-1].cuts
            cuts.clear()
            in_segments(model, x, 7)
        assert torch.equal(torch.cat([c.cuts for c in cuts], dim=1), whole)
        cuts_seen[longest] = whole
    assert cuts_seen[0].sum(1).tolist() == [1, 1]  # unbounded: one chunk for the whole text
    assert cuts_seen[5][0].nonzero().flatten().tolist() == list(range(0, 28, 5))


@pytest.mark.parametrize("name", sorted(BOUNDARY_PREDICTORS))
def test_activation_checkpointing_recomputes_the_same_chunks(name):
    """The block recomputed in the backward pass cuts the same chunks: the gradients (the boundary losses'
    included) equal those of a pass that kept its activations."""
    x = torch.randint(0, 30, (2, 19))
    grads = []
    for every in (0, 1):
        model = dynamic(name).train()
        model.transformer.stack.activation_checkpointing = every
        out = model(x, labels=x)
        (out.loss + out.aux_loss).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert (a is None and b is None) or torch.allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("boundaries", sorted(BOUNDARY_PREDICTORS))
def test_training_resumes_bit_for_bit(boundaries, tmp_path):
    def run():
        config = tiny_run(max_steps=8, eval_interval=4, grad_accum=2)
        model = config.model.to_dict()
        model.update(n_layer=3)
        model["hourglass"].update(shorten_layers=[1, 2], shorten_factor=2, boundaries=boundaries)
        config.model = ModelConfig.from_dict(model)
        return config

    assert_resumes_exactly(run, tmp_path, stop_after=3)


def test_bad_options_are_refused_by_name():
    base = dict(SMALL, shorten_layers=[1, 3])
    with raises_naming(ConfigError, "boundaries=learned", "shorten_layers"):
        ModelConfig(**SMALL, boundaries="learned")
    with raises_naming(ConfigError, "boundaries", "learned"):  # the registry's name, refused when a model is built
        build_model(ModelConfig(**base, boundaries="learnt"))
    with raises_naming(ConfigError, "boundaries=entropy", "attention", "ssm"):
        ModelConfig(**base, boundaries="entropy", mixer=["attention", "ssm", "attention", "attention"])
    with raises_naming(ConfigError, "same_length"):
        ModelConfig(**base, boundaries="learned", same_length=True)
    with raises_naming(ConfigError, "ratio_loss"):
        ModelConfig(**base, boundaries="learned", ratio_loss=-1.0)
    with raises_naming(ConfigError, "entropy_rule"):
        ModelConfig(**base, boundaries="entropy", entropy_rule="spike")
    with raises_naming(ConfigError, "coarse_mem_len", "mem_len > 0"):
        ModelConfig(**base, boundaries="learned", coarse_mem_len=8, mem_len=0)
    with raises_naming(ConfigError, "coarse_mem_len", ">= 0"):
        ModelConfig(**base, coarse_mem_len=-1)
    with raises_naming(ConfigError, "max_chunk", "shorten_factor=4", "got 3"):
        ModelConfig(**base, boundaries="entropy", shorten_factor=4, max_chunk=3)
    assert ignored_options(ModelConfig(**base, max_chunk=8)) == ["hourglass.max_chunk=8"]  # fixed groups: no bound
    assert ignored_options(ModelConfig(**SMALL, coarse_mem_len=8)) == ["hourglass.coarse_mem_len=8"]
    assert ignored_options(ModelConfig(**base, boundaries="entropy", ratio_loss=0.1)) == ["hourglass.ratio_loss=0.1"]
    assert ignored_options(ModelConfig(**base, boundaries="learned", shorten_fn="mean")) == [
        "hourglass.shorten_fn=mean"
    ]
    assert ignored_options(ModelConfig(**base, residual_proj=False)) == ["hourglass.residual_proj=False"]
    assert ignored_options(ModelConfig(**base, boundaries="entropy", residual_proj=False)) == [
        "hourglass.residual_proj=False"
    ]


def test_the_residual_projection_starts_at_zero_and_a_config_stored_without_it_loads_as_trained(tmp_path):
    """H-Net's residual_proj starts at zero, so that a new block's output is its coarse path alone; a checkpoint
    whose stored config predates the option (no ``residual_proj`` key) was trained with the input itself added,
    and loads so, with the same scores."""
    from longseq.data.tokenizers import ByteTokenizer
    from longseq.train import load_checkpoint, save_checkpoint

    name = "learned"
    assert dynamic("entropy").transformer.stack.layers[1].residual is None  # entropy chunks add the input itself
    model = dynamic(name)
    block = model.transformer.stack.layers[1]
    assert not block.residual.weight.any() and not block.residual.bias.any()
    seen = []
    hook = block.register_forward_hook(lambda module, args, out: seen.append((args[0], out.hidden)))
    x = torch.randint(0, 30, (2, 12))
    with torch.no_grad():
        model(x)
        block.residual = None  # the input itself: the output moves by exactly the input
        model(x)
    hook.remove()
    torch.testing.assert_close(seen[1][1] - seen[0][1], seen[0][0], rtol=0, atol=1e-12)

    run = tiny_run()
    run.model = ModelConfig(**{**SMALL, "vocab_size": 256, "shorten_layers": [1, 3], "shorten_factor": 3,
                               **PREDICTORS[name], "residual_proj": False})  # fmt: skip
    old = TransformerXLLM(run.model).eval()
    save_checkpoint(str(tmp_path / "old"), old, run, ByteTokenizer())
    stored = json.loads((tmp_path / "old" / "config.json").read_text())
    del stored["run"]["model"]["hourglass"]["residual_proj"]  # as written before the option
    rewrite_listed(tmp_path / "old", "config.json", json.dumps(stored))
    loaded, _, config, _ = load_checkpoint(str(tmp_path / "old"))
    assert config.model.hourglass.residual_proj is False and loaded.transformer.stack.layers[1].residual is None
    x = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, old(x).logits, rtol=0, atol=0)


def test_the_boundaries_a_diagnosis_reads_and_their_statistics():
    """read_boundaries reads a stream in segments and gives the whole pass's boundaries; chunk_statistics counts
    chunk lengths and where they begin on a hand-cut text."""
    model = dynamic("learned")
    x = torch.randint(0, 30, (1, 23))
    cuts, _ = recorded_cuts(model)
    with torch.no_grad():
        model(x)
    assert torch.equal(read_boundaries(model, x[0], 5), cuts[0].cuts[0])
    hooks = dict(model.transformer.stack.layers[1].boundaries._forward_hooks)
    model.train()
    with raises_naming(RuntimeError, "token ids"):  # a token outside the vocabulary: the model is left as it was
        read_boundaries(model, torch.tensor([1, 99]), 5)
    assert model.training and model.transformer.stack.layers[1].boundaries._forward_hooks == hooks
    text = b"ab cd\nef"  # chunks "ab", " cd", "\nef": lengths 2, 3, 3
    stats = chunk_statistics(text, torch.tensor([1, 0, 1, 0, 0, 1, 0, 0]), mem_len=4)
    assert (stats["chunks"], stats["mean_length"], stats["longest"]) == (3, 8 / 3, 3)
    assert abs(stats["std_length"] - (2 / 9) ** 0.5) < 1e-12 and stats["memory_bytes"] == 4 * 8 / 3
    assert (stats["at_space"], stats["at_word_start"], stats["word_starts_in_text"]) == (2 / 3, 0.0, 2 / 8)


@pytest.mark.parametrize("weight", [0.3, 0.0])
def test_the_ratio_loss_is_each_micro_batchs_and_every_other_loss_the_whole_batchs(weight, monkeypatch):
    """Pins what a step with ``grad_accum`` = 2 (or two ranks) does with learned chunks: the update of 4 rows read in
    two halves is the whole batch's, but for H-Net's ratio loss, which is each half's own (its F and G are that
    half's means, as H-Net computes it on each device's batch; F has no gradient, so the whole batch's would need
    every half's forward before the first backward).  The gradients differ by exactly the gradient of weight x
    (the mean of the halves' ratio losses - the whole batch's ratio loss); with no ratio loss they are equal.
    Trained 5 steps, grad_accum 1 and 2 gave router weights 7.1e-3 apart at weight 0.3, 1.7e-8 at 0."""
    from longseq.model import boundaries

    calls, own = [], boundaries.ratio_loss
    monkeypatch.setattr(
        boundaries, "ratio_loss", lambda cuts, probs, n: calls.append((cuts, probs)) or own(cuts, probs, n)
    )
    model = dynamic("learned", ratio_loss=weight).train()
    params = [p for p in model.parameters()]
    x, y = torch.randint(0, 30, (4, 12)), torch.randint(0, 30, (4, 12))
    whole = model(x, labels=y)
    total = whole.loss + (whole.aux_loss if whole.aux_loss is not None else 0)
    expected = torch.autograd.grad(total, params, allow_unused=True)
    calls.clear()
    halves = [model(x[rows], labels=y[rows]) for rows in (slice(0, 2), slice(2, 4))]
    step = sum(h.loss + (h.aux_loss if h.aux_loss is not None else 0) for h in halves) / 2  # the trainer's sum
    if weight:
        cuts, probs = (torch.cat(parts) for parts in zip(*calls))
        apart = sum(own(c, p, 3) for c, p in calls) / 2
        step = step - weight * (apart - own(cuts, probs, 3))  # the whole batch's ratio loss in place of the halves'
    got = torch.autograd.grad(step, params, allow_unused=True, retain_graph=True)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None) and (g is None or torch.allclose(g, e, rtol=0, atol=1e-10))
    if weight:
        plain = torch.autograd.grad(step + weight * (apart - own(cuts, probs, 3)), params, allow_unused=True)
        router = [i for i, p in enumerate(params) if p is model.transformer.stack.layers[1].boundaries.q_proj.weight]
        assert (plain[router[0]] - expected[router[0]]).abs().max() > 1e-6  # the halves' own losses: another update


def test_same_length_is_refused_at_evaluation_as_in_training(tmp_path, text_corpus, capsys):
    """Training refuses same_length with learned chunks; evaluation took it (a call's ``recurrence``, ``eval --set
    same_length=true``, lm-eval's ``same_length``) and applied it to the full-resolution layers only.  Every path
    resolves a call's recurrence through ``ModelConfig.recurrence``, which now refuses it by name; the context
    curve, which turns it on by default, leaves it off for such a model."""
    from longseq.cli import main
    from longseq.config import DataConfig, Recurrence, RunConfig, TrainConfig
    from longseq.data.tokenizers import ByteTokenizer
    from longseq.train.checkpoint import save_checkpoint

    model = dynamic("learned", mem_len=8).float()
    x = torch.randint(0, 30, (2, 9))
    for given in (Recurrence(8, same_length=True), Recurrence(0, same_length=True)):
        with raises_naming(ConfigError, "same_length", "boundaries=learned", "full-resolution"):
            model(x, recurrence=given)
    with raises_naming(ConfigError, "same_length", "boundaries=learned", "full-resolution"):
        model.config.recurrence(same_length=True)
    config = ModelConfig(**{**SMALL, "vocab_size": 256, "mem_len": 8, "shorten_layers": [1, 3],
                            "boundaries": "learned"})  # fmt: skip
    run = RunConfig(config, DataConfig(tokenizer="byte", eval_tgt_len=8, eval_batch_size=1), TrainConfig())
    save_checkpoint(str(tmp_path / "ckpt"), TransformerXLLM(config), run, ByteTokenizer())
    argv = ["eval", "--checkpoint", str(tmp_path / "ckpt"), "--data", str(text_corpus), "--device", "cpu", "--quiet"]
    capsys.readouterr()
    assert main([*argv, "--set", "same_length=true", "max_segments=2"]) != 0
    assert "same_length" in capsys.readouterr().err
    assert main([*argv, "--context-curve", "0,8", "--set", "max_segments=2"]) == 0


def test_the_chunk_tools_on_empty_input_give_no_starts_or_a_named_error():
    """No tokens: no chunk starts (an empty tensor), as the model's own pass over none would give; statistics of no
    text, or of starts that do not fit it, are errors that say so."""
    model = dynamic("learned")
    starts = read_boundaries(model, torch.zeros(0, dtype=torch.long), 5)
    assert starts.shape == (0,) and starts.dtype == torch.bool
    with raises_naming(ValueError, "(T,)", "(1, 4)"):
        read_boundaries(model, torch.zeros(1, 4, dtype=torch.long), 5)
    with raises_naming(ValueError, "segment=0"):
        read_boundaries(model, torch.zeros(4, dtype=torch.long), 0)
    with raises_naming(ValueError, "empty"):
        chunk_statistics(b"", starts, mem_len=4)
    with raises_naming(ValueError, "3 positions", "2 bytes"):
        chunk_statistics(b"ab", torch.tensor([1, 0, 0]), mem_len=4)
    with raises_naming(ValueError, "no chunk start"):
        chunk_statistics(b"ab", torch.tensor([0, 0]), mem_len=4)
