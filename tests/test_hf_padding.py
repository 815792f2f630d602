"""Padding and beam search through transformers' own API, held to longseq's own outputs: a padded batch (left
padding as transformers pads for generation, or zeros anywhere in ``attention_mask``) gives every row the logits,
loss, memory and greedy tokens that longseq gives the row alone; beam search is the search over longseq's own
scores (exhaustive where the beams cover every prefix, a naive recomputing beam search otherwise), over a padded
batch too; the cache's row operations are ``Memory.select``."""

import itertools

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"longseq.hf needs transformers 5, this is {transformers.__version__}", allow_module_level=True)

import longseq.hf  # noqa: E402, F401  (registers the classes)
from longseq import ModelConfig  # noqa: E402
from longseq.generation import generate, read_prompt  # noqa: E402
from longseq.hf import LongseqCache  # noqa: E402
from longseq.model import build_model  # noqa: E402

BASE = dict(vocab_size=50, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=6, dropout=0.0)
KINDS = {  # patterns whose masks depend on the segment (bigbird, global), every mixer, hourglass, memory policies
    "xl": {},
    "bigbird-global": dict(attention=["bigbird", "global"], window=2, block_size=2, num_global=1, num_random_blocks=1),
    "mixers": dict(n_layer=4, mixer=["ssm", "attention", "conv", "rnn"], head_dim=8),
    "hourglass": dict(n_layer=4, shorten_layers=[1, 3]),
    "learned-chunks": dict(n_layer=4, shorten_layers=[1, 3], boundaries="learned"),
    "compressed-tokens-int8": dict(cmem_len=4, cmem_rate=2, cmem_fn="linear", mem_tokens=2, mem_quant="int8"),
    "absolute-no-memory": dict(pos="absolute", mem_len=0),
    "lstm": dict(arch="lstm"),
}
SEGMENT, MEM = 4, 9  # prompts of up to 11 tokens: read in up to three segments, the memory truncated
LENGTHS = [11, 5, 8, 1]


def tiny(name: str, **extra):
    """A random model whose predictions depend on the context (init_std 0.3: at 0.02 a random model repeats one
    token whatever it reads, and a wrong memory would go unseen)."""
    torch.manual_seed(0)
    return build_model(ModelConfig(**{**BASE, "init_std": 0.3, **KINDS[name], **extra})).eval()


def hf_of(model):
    return longseq.hf.from_longseq(model, segment_len=SEGMENT, generate_mem_len=MEM)


def left_padded(rows: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths as transformers pads them for generation: (B, L) ids and attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :], mask[i, width - len(r) :] = r, 1
    return ids, mask


def prompts(vocab: int = 50, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in LENGTHS]


@pytest.mark.parametrize("name", list(KINDS))
def test_a_padded_batch_gives_every_row_its_own_logits_and_greedy_tokens(name):
    """Left padding: each row's logits at its positions are longseq's for the row alone (one segment), and
    ``generate`` draws longseq's greedy tokens for the row alone (its prompt read in its own segments)."""
    model = tiny(name)
    hf = hf_of(model)
    rows = prompts()
    ids, mask = left_padded(rows, pad=0)
    with torch.no_grad():
        out = hf(ids, attention_mask=mask, output_hidden_states=name != "lstm")
        made = hf.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    for i, row in enumerate(rows):
        at = slice(ids.size(1) - len(row), None)
        with torch.no_grad():
            alone = model(row[None]).logits[0]
        torch.testing.assert_close(out.logits[i, at], alone, atol=1e-5, rtol=1e-5)
        assert out.logits[i, : at.start].abs().sum() == 0  # the padded positions: zeros
        expected = generate(
            model, row[None], 10, temperature=0, recurrence=model.config.recurrence(mem_len=MEM), segment_len=SEGMENT
        )
        assert torch.equal(made[i, ids.size(1) :], expected[0]), i
    if name != "lstm":
        hidden = out.hidden_states[-1]
        assert hidden.shape == (4, ids.size(1), 16) and hidden[1, : ids.size(1) - 5].abs().sum() == 0


def test_padding_anywhere_is_skipped_and_the_memory_carries_on():
    """Zeros anywhere in ``attention_mask`` (left, inside, right) and the padding id ``vocab_size`` without a mask:
    each row reads its kept tokens as if alone; the cache carries each row's memory into the next segment, and the
    loss is the mean over every row's own shifted tokens."""
    model = tiny("mixers")
    hf = hf_of(model)
    first = torch.randint(0, 50, (3, 7))
    mask = torch.ones_like(first)
    mask[0, :3] = 0  # left
    mask[1, 2:4] = 0  # inside
    mask[2, 5:] = 0  # right
    nxt = torch.randint(0, 50, (3, 4))
    with torch.no_grad():
        out = hf(first, attention_mask=mask, labels=first)
        by_id = hf(first.masked_fill(mask == 0, 50), labels=first)  # the padding id, no mask
        more = hf(nxt, cache=out.cache)
    assert torch.equal(out.logits, by_id.logits) and torch.equal(out.loss, by_id.loss)
    nll, count = 0.0, 0
    for i in range(3):
        row = first[i][mask[i] == 1][None]
        with torch.no_grad():
            alone = model(row)
            torch.testing.assert_close(out.logits[i][mask[i] == 1], alone.logits[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(
                more.logits[i], model(nxt[i : i + 1], alone.mems).logits[0], atol=1e-5, rtol=1e-5
            )
        nll = nll + F.cross_entropy(alone.logits[0, :-1], row[0, 1:], reduction="sum")
        count += row.size(1) - 1
    torch.testing.assert_close(out.loss, nll / count)


def test_the_padding_id_in_a_prompt_is_text_and_a_leading_run_is_left_padding():
    """``generate(..., pad_token_id=P)`` without a mask: transformers infers ``input_ids != P``; P inside a prompt
    is text (the tokens of the prompt without ``pad_token_id``), a row's leading run of P is left padding (the
    tokens of the row without it)."""
    model = tiny("xl")
    hf = hf_of(model)
    x = torch.randint(1, 50, (2, 7))
    x[1, 3] = 0
    same = hf.generate(x, pad_token_id=0, max_new_tokens=4, do_sample=False)
    assert torch.equal(same, hf.generate(x, max_new_tokens=4, do_sample=False))
    x[0, :2] = 0  # row 0 is left-padded by two
    made = hf.generate(x, pad_token_id=0, max_new_tokens=4, do_sample=False)
    expected = generate(
        model, x[:1, 2:], 4, temperature=0, recurrence=model.config.recurrence(mem_len=MEM), segment_len=SEGMENT
    )
    assert torch.equal(made[0, 7:], expected[0])
    assert torch.equal(made[1, 7:], same[1, 7:])


def test_padding_is_refused_where_it_cannot_be_read():
    hf = hf_of(tiny("xl"))
    x = torch.randint(0, 50, (2, 5))
    mask = torch.ones_like(x).index_fill(1, torch.tensor([0]), 0)
    with pytest.raises(ValueError, match="output_attentions is not available with padding"):
        hf(x, attention_mask=mask, output_attentions=True)
    with pytest.raises(ValueError, match="row 1 of input_ids is all padding"):
        hf.generate(x, attention_mask=torch.tensor([[1] * 5, [0] * 5]), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"input_ids\[1, 2\] = 51 is outside the vocabulary of 50 tokens"):
        hf(x.index_put((torch.tensor([1]), torch.tensor([2])), torch.tensor(51)))
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 3\) must be"):
        hf(x, attention_mask=mask[:, :3])
    with pytest.raises(ValueError, match="a longseq memory cannot be rolled back"):
        hf.generate(x[:1], prompt_lookup_num_tokens=2, max_new_tokens=2, do_sample=False)


# -- beam search ---------------------------------------------------------------------------------------------------


def longseq_log_probs(model, prompt: torch.Tensor, continuations: torch.Tensor) -> torch.Tensor:
    """The total log-probability (N,) longseq's own model gives each continuation (N, n) of ``prompt`` (P,), read
    as ``longseq generate`` reads: the prompt but its last token in segments, then one token at a time."""
    ids = prompt.expand(continuations.size(0), -1)
    recurrence = model.config.recurrence(mem_len=MEM)
    with torch.no_grad():
        memory = read_prompt(model, ids[:, :-1], SEGMENT, recurrence)
        token, total = ids[:, -1:], torch.zeros(continuations.size(0))
        for t in range(continuations.size(1)):
            scores, memory = model.next_token_scores(token, memory, recurrence=recurrence)
            token = continuations[:, t : t + 1]
            total = total + F.log_softmax(scores.float(), dim=-1).gather(1, token).squeeze(1)
    return total


def naive_beam_search(model, prompt: torch.Tensor, beams: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search without a cache: every hypothesis scored from scratch by :func:`longseq_log_probs`; the best
    continuation and its total log-probability."""
    vocab = model.config.vocab_size
    hypotheses, scores = torch.zeros(1, 0, dtype=torch.long), torch.zeros(1)
    for _ in range(steps):
        grown = torch.cat(
            [hypotheses.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(len(hypotheses))[:, None]], 1
        )
        totals = longseq_log_probs(model, prompt, grown)
        best = totals.topk(beams).indices
        hypotheses, scores = grown[best], totals[best]
    return hypotheses[0], scores[0]


def beam_search(beams: int, new_tokens: int) -> dict:
    """generate()'s arguments for a beam search with scores and no length penalty (the scores are plain sums)."""
    return dict(num_beams=beams, do_sample=False, max_new_tokens=new_tokens, length_penalty=0.0,
                return_dict_in_generate=True, output_scores=True)  # fmt: skip


def test_beam_search_with_a_beam_per_prefix_is_exhaustive_search():
    """With ``num_beams`` = V ** (n - 1), beam search keeps every prefix: its answer is the best of all V ** n
    continuations, by longseq's own scores (vocabulary 6, 3 tokens: 216 continuations)."""
    model = tiny("mixers", vocab_size=6)
    hf = hf_of(model)
    prompt = torch.randint(0, 6, (7,), generator=torch.Generator().manual_seed(2))
    every = torch.tensor(list(itertools.product(range(6), repeat=3)))
    totals = longseq_log_probs(model, prompt, every)
    out = hf.generate(prompt[None], **beam_search(36, 3))
    assert torch.equal(out.sequences[0, 7:], every[totals.argmax()])
    torch.testing.assert_close(out.sequences_scores[0], totals.max(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", ["xl", "hourglass", "compressed-tokens-int8"])
def test_beam_search_is_a_naive_beam_search_over_longseqs_scores(name):
    """Three beams, six tokens: transformers' beam search over the cache (reordered every step) finds what a beam
    search that scores every hypothesis from scratch finds, with the same total log-probability."""
    model = tiny(name)
    hf = hf_of(model)
    prompt = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(3))
    best, score = naive_beam_search(model, prompt, beams=3, steps=6)
    out = hf.generate(prompt[None], **beam_search(3, 6))
    assert torch.equal(out.sequences[0, 9:], best)
    torch.testing.assert_close(out.sequences_scores[0], score, atol=1e-4, rtol=1e-5)


def test_beam_search_over_a_padded_batch_gives_each_row_its_own_beams():
    model = tiny("mixers")
    hf = hf_of(model)
    rows = prompts()
    ids, mask = left_padded(rows, pad=50)
    search = beam_search(3, 5)
    out = hf.generate(ids, attention_mask=mask, num_return_sequences=2, **search)
    for i, row in enumerate(rows):
        alone = hf.generate(row[None], num_return_sequences=2, **search)
        assert torch.equal(out.sequences[2 * i : 2 * i + 2, ids.size(1) :], alone.sequences[:, len(row) :]), i
        torch.testing.assert_close(
            out.sequences_scores[2 * i : 2 * i + 2], alone.sequences_scores, atol=1e-4, rtol=1e-5
        )


@pytest.mark.parametrize("padded", [False, True], ids=["one-memory", "padded-groups"])
def test_the_caches_row_operations_move_each_rows_memory(padded):
    """``reorder_cache``, ``batch_select_indices`` and ``batch_repeat_interleave`` (as transformers 5 calls them):
    reading on from the changed cache gives the logits of the rows it now holds, in their new order."""
    model = tiny("hourglass")
    hf = hf_of(model)
    x = torch.randint(0, 50, (3, 6))
    mask = torch.ones_like(x)
    if padded:
        mask[0, :2] = 0
        mask[2, :1] = 0
    nxt = torch.randint(0, 50, (3, 2))
    with torch.no_grad():
        cache = hf(x, attention_mask=mask).cache
        assert len(cache.groups) == (3 if padded else 1)
        expected = hf(nxt, cache=cache).logits  # (3, 2, V)
        for operation, argument, rows in (
            ("reorder_cache", torch.tensor([2, 0, 1]), [2, 0, 1]),
            ("batch_select_indices", torch.tensor([1, 2]), [1, 2]),
            ("batch_repeat_interleave", 2, [0, 0, 1, 1, 2, 2]),
        ):
            changed = hf(x, attention_mask=mask).cache
            getattr(changed, operation)(argument)
            assert changed.batch_size == len(rows)
            torch.testing.assert_close(hf(nxt[rows], cache=changed).logits, expected[rows], atol=1e-5, rtol=1e-5)
    assert isinstance(cache, LongseqCache)
