"""Tasks: heads that need the memory (a label segments back, an answer segments after its question), document
pooling, the joint LM loss, the backbone's auxiliary loss in every head's, BERT masking, span metrics and answer offsets, padding; task data (JSONL errors by file,
line and field, ListOps); the classifier's labels; the length-grouped sampler; and what a classification run says
about documents longer than its gradient reaches."""

import json
import statistics

import numpy as np
import pytest
import torch
from support import (
    ABC_TOKENIZER,
    DOC_SEGMENT,
    assert_names,
    classify_run,
    interrupt_json_writes_after,
    label_first_documents,
    last_json,
    raises_naming,
)

from longseq import ModelConfig, TransformerXLLM
from longseq.cli import main
from longseq.config import ConfigError
from longseq.config.run import TaskConfig
from longseq.data.tasks import TaskDataError, generate_listops, listops_value, read_jsonl
from longseq.model.heads import DocumentClassifier, MaskedLM, SpanExtractor, best_spans, mask_tokens, read_segments
from longseq.tasks import task_for
from longseq.tasks.base import LengthGroupedBatches, training_batches

N_CLASSES, SEG, N_SEG = 4, 8, 6


def memory_task(n: int, seed: int):
    """The label is token 1 + c at the start of the first of six segments; everything else is noise (5..19)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, N_CLASSES, (n,), generator=g)
    docs = torch.randint(5, 20, (n, SEG * N_SEG), generator=g)
    docs[:, 0] = 1 + labels
    return docs, labels


def train_classifier(mem_len: int, pooling: str = "last") -> float:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.0,
                         mem_len=mem_len)  # fmt: skip
    model = DocumentClassifier(TransformerXLLM(config), N_CLASSES, pooling=pooling)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    docs, labels = memory_task(2048, seed=1)
    for step in range(150):
        batch = slice((step * 32) % 2048, (step * 32) % 2048 + 32)
        loss = model(docs[batch], SEG, labels[batch])["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    test_docs, test_labels = memory_task(512, seed=2)
    with torch.no_grad():
        predicted = model(test_docs, SEG)["logits"].argmax(-1)
    return float((predicted == test_labels).float().mean())


def test_a_label_five_segments_back_is_learned_with_memory_and_not_without():
    assert train_classifier(mem_len=SEG * (N_SEG - 1)) >= 0.9
    assert train_classifier(mem_len=0) < 0.4  # chance is 0.25


def test_document_pooling_reaches_the_first_segment_without_a_memory():
    """The mean over the whole document trains every segment's computation: the label in the first of six
    segments is learned with no memory at all, where the final segment's summary stays near chance (above)."""
    assert train_classifier(mem_len=0, pooling="document") >= 0.9


def test_document_pooling_is_the_mean_over_the_whole_document():
    """Read in three segments with the memory, the document's mean equals the mean of the document read as one
    segment, and the classifier's logits are that mean through the linear head (float64)."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0,
                         mem_len=2 * SEG)  # fmt: skip
    classifier = DocumentClassifier(TransformerXLLM(config), N_CLASSES, pooling="document").double().eval()
    docs, _ = memory_task(3, seed=4)
    docs = docs[:, : 3 * SEG]
    with torch.no_grad():
        chunked = classifier(docs, SEG)["logits"]
        hidden = classifier.lm.hidden_states(docs)[0]  # (B, 3 x SEG, E), one segment
        expected = classifier.classifier(hidden.mean(1))
    torch.testing.assert_close(chunked, expected, rtol=0, atol=1e-10)


def test_document_pooling_weighs_every_real_token_alike():
    """A document of 2 x SEG + 3 tokens, left-padded to three segments (the first holds 3 real tokens and
    SEG - 3 filler): its mean is the mean over its 2 x SEG + 3 tokens read alone as one segment, not a mean of
    segment means."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0,
                         mem_len=3 * SEG)  # fmt: skip
    classifier = DocumentClassifier(TransformerXLLM(config), N_CLASSES, pooling="document").double().eval()
    doc = torch.randint(5, 20, (1, 2 * SEG + 3))
    padded_doc = torch.cat([torch.zeros(1, SEG - 3, dtype=torch.long), doc], dim=1)
    padding = torch.arange(3 * SEG)[None] < SEG - 3
    with torch.no_grad():
        pooled = classifier(padded_doc, SEG, padding=padding)["logits"]
        expected = classifier.classifier(classifier.lm.hidden_states(doc)[0].mean(1))
    torch.testing.assert_close(pooled, expected, rtol=0, atol=1e-10)


def test_joint_lm_loss_adds_to_the_task_loss():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=8)
    model = DocumentClassifier(TransformerXLLM(config), N_CLASSES, pooling="mean")
    docs, labels = memory_task(4, seed=3)
    task = model(docs, SEG, labels)["loss"]
    joint = model(docs, SEG, labels, lm_weight=0.5)["loss"]
    assert joint.item() > task.item() + 0.5  # half of an LM loss near ln 20 = 3.0 on an untrained model


def _without_aux(lm: TransformerXLLM) -> None:
    """Make ``lm`` report no auxiliary loss (the heads' reading before they added it)."""
    lm.hidden_states = lambda *a, **k: (*TransformerXLLM.hidden_states(lm, *a, **k)[:2], None)


@pytest.mark.parametrize("head", ["classify", "span", "mlm"])
def test_every_head_trains_the_backbones_auxiliary_loss(head):
    """An entropy boundary predictor's probe learns only from the auxiliary loss (its next-token loss and the
    threshold's pinball loss).  Each head's training loss is its own plus the mean of that loss over the segments
    read, as a language model's is; the probe then gets a gradient, which it did not while the heads dropped it."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=8,
                         shorten_layers=[1, 2], shorten_factor=2, boundaries="entropy")  # fmt: skip
    lm = TransformerXLLM(config).train()
    docs, labels = memory_task(4, seed=3)
    expected = torch.stack([read.aux for read in read_segments(lm, docs, SEG)]).mean()
    if head == "classify":
        model, args, key = DocumentClassifier(lm, N_CLASSES, pooling="document"), (docs, SEG, labels), "loss"
    elif head == "span":
        model, args, key = SpanExtractor(lm), (docs, SEG, None, labels, labels + 3), "loss"
    else:
        model, args, key = MaskedLM(lm), (docs, SEG, docs.masked_fill(docs > 10, -100)), "nll"
    out = model(*args)
    loss = out[key] + out["aux"] if head == "mlm" else out[key]
    loss.backward()
    probe = lm.transformer.stack.layers[1].boundaries.head.weight
    assert probe.grad is not None and bool(probe.grad.abs().sum() > 0)
    _without_aux(lm)
    alone = model(*args)
    if head == "mlm":
        assert alone["aux"] == 0.0 and torch.equal(alone["nll"], out["nll"])
        torch.testing.assert_close(out["aux"], expected, rtol=0, atol=1e-12)
    else:
        torch.testing.assert_close(out[key] - alone[key], expected, rtol=0, atol=1e-6)


def test_masking_follows_the_80_10_10_rule_at_the_configured_rate():
    ids = torch.randint(5, 1000, (200, 500))
    inputs, labels = mask_tokens(ids, 0.15, mask_id=0, vocab_size=1000, generator=torch.Generator().manual_seed(0))
    chosen = labels != -100
    n = ids.numel()
    assert abs(chosen.sum().item() / n - 0.15) < 0.005
    masked = (inputs == 0) & chosen
    kept = (inputs == ids) & chosen
    assert abs(masked.sum().item() / chosen.sum().item() - 0.8) < 0.01
    # random replacements equal the original 1 time in 1000: the kept share is 0.1 + 0.1/1000
    assert abs(kept.sum().item() / chosen.sum().item() - 0.1) < 0.01
    assert torch.equal(inputs[~chosen], ids[~chosen]) and torch.equal(labels[chosen], ids[chosen])


def test_malformed_jsonl_names_the_line_and_the_problem(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "label": 1}\n{"text": "b"}\n')
    with raises_naming(TaskDataError, "train.jsonl:2", "'label'"):
        read_jsonl(str(path), "classify")
    path.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 0\n')
    with pytest.raises(TaskDataError, match=r":3: not valid JSON"):
        read_jsonl(str(path), "classify")
    path.write_text(json.dumps({"context": "one two three", "question": "q", "answer_start": 4, "answer_text": "two"}))
    assert read_jsonl(str(path), "span")[0]["answer_text"] == "two"
    path.write_text(json.dumps({"context": "one two three", "question": "q", "answer_start": 0, "answer_text": "two"}))
    with raises_naming(TaskDataError, ":1", "answer_text", "not found"):
        read_jsonl(str(path), "span")


def test_listops_is_deterministic_and_labels_are_the_values():
    a, b = generate_listops(30, seed=5, min_length=20, max_length=300), generate_listops(30, seed=5, min_length=20,
                                                                                          max_length=300)  # fmt: skip
    assert a == b and a != generate_listops(30, seed=6, min_length=20, max_length=300)
    assert all(20 <= len(x["text"].split()) <= 300 for x in a)
    assert {x["label"] for x in a} <= set(range(10))
    assert listops_value(("[MAX", [2, 9, ("[MIN", [4, 7]), 0])) == 9
    assert listops_value(("[SM", [5, 7, ("[MED", [1, 8, 3])])) == (5 + 7 + 3) % 10
    assert listops_value(("[MED", [1, 2, 3, 4])) == int(statistics.median([1, 2, 3, 4]))


def train_mlm(bidirectional: bool) -> float:
    """Documents of pairs (a, a + 10) with a in 1..10; a masked first element is predictable only from the token
    after it."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=21, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.0,
                         mem_len=8, bidirectional=bidirectional)  # fmt: skip
    model = TransformerXLLM(config)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        first = torch.randint(1, 11, (32, 8), generator=g)
        ids = torch.stack([first, first + 10], dim=2).flatten(1)  # (B, 16)
        inputs, labels = mask_tokens(ids, 0.25, mask_id=0, vocab_size=21, generator=g)
        loss = model(inputs, None, labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    first = torch.randint(1, 11, (256, 8), generator=g)
    ids = torch.stack([first, first + 10], dim=2).flatten(1)
    inputs = ids.clone()
    inputs[:, 6] = 0  # mask the first copy of the fourth pair
    with torch.no_grad():
        predicted = model(inputs).logits[:, 6].argmax(-1)
    return float((predicted == ids[:, 6]).float().mean())


def test_masked_lm_uses_the_right_context_only_when_bidirectional():
    assert train_mlm(bidirectional=True) >= 0.9
    assert train_mlm(bidirectional=False) < 0.3  # chance is 0.1


KEYS, SPAN_SEGMENTS = 8, 4


def span_task(n: int, seed: int):
    """The question (one of 8 key tokens, 2..9) fills the first segment; two segments of noise (10..29) follow;
    the fourth segment holds four different keys at even offsets, each followed by a noise token.  The answer is
    the question's key and the token after it: three segments after the question, reachable only through memory.
    """
    g = torch.Generator().manual_seed(seed)
    docs = torch.randint(10, 30, (n, SEG * SPAN_SEGMENTS), generator=g)
    last = (SPAN_SEGMENTS - 1) * SEG
    starts = torch.empty(n, dtype=torch.long)
    for row in range(n):
        keys = (torch.randperm(KEYS, generator=g)[: SEG // 2] + 2).tolist()
        question = keys[int(torch.randint(0, len(keys), (1,), generator=g))]
        docs[row, : SEG - 1] = question
        docs[row, SEG - 1] = 1  # separator
        for slot, key in enumerate(keys):
            docs[row, last + 2 * slot] = key
        starts[row] = last + 2 * keys.index(question)
    allowed = torch.zeros_like(docs, dtype=torch.bool)
    allowed[:, SEG:] = True  # the context
    return docs, allowed, starts, starts + 1


def train_span(mem_len: int) -> float:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=30, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.0,
                         mem_len=mem_len)  # fmt: skip
    model = SpanExtractor(TransformerXLLM(config))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(500):
        docs, allowed, starts, ends = span_task(32, seed=1000 + step)
        loss = model(docs, SEG, allowed, starts, ends)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    docs, allowed, starts, ends = span_task(256, seed=1)
    with torch.no_grad():
        out = model(docs, SEG, allowed)
    predicted = best_spans(out["start_logits"], out["end_logits"], max_len=4)
    return float(((predicted[:, 0] == starts) & (predicted[:, 1] == ends)).float().mean())


@pytest.mark.slow
def test_an_answer_three_segments_after_the_question_is_found_with_memory_and_not_without():
    assert train_span(mem_len=SEG * (SPAN_SEGMENTS - 1)) >= 0.9
    assert train_span(mem_len=0) < 0.5  # four candidate keys: chance is 0.25


def test_span_metrics_follow_squad():
    from longseq.tasks.span import span_metrics

    assert span_metrics(["the Denver Broncos!"], ["Denver Broncos"]) == {"exact_match": 1.0, "f1": 1.0}
    # one of two gold words: precision 1, recall 1/2
    assert span_metrics(["Broncos", "Carolina"], ["Denver Broncos", "Denver Broncos"]) == pytest.approx(
        {"exact_match": 0.0, "f1": (2 / 3) / 2}
    )


@pytest.mark.parametrize("kind", ["byte", "char", "word"])
def test_answer_offsets_map_to_the_answer_tokens(kind):
    from longseq.data.tokenizers import build_tokenizer
    from longseq.tasks.span import encode_spans

    context = "north of the river\nlies the old mill, said Jörg.\n"
    tokenizer = build_tokenizer(kind, context + "where is it?\n")
    record = {"question": "where is it?", "context": context, "answer_start": context.index("old mill"),
              "answer_text": "old mill"}  # fmt: skip
    example = encode_spans([record], tokenizer, "q.jsonl")[0]
    assert len(tokenizer.offsets(context)) == len(tokenizer.encode(context))
    answer = example["ids"][example["start"] : example["end"] + 1]
    assert tokenizer.decode(answer).strip() == ("old mill," if kind == "word" else "old mill")  # "mill," is one word
    record = {**record, "answer_start": context.index("ld mill"), "answer_text": "ld mi"}  # parts of two tokens
    example = encode_spans([record], tokenizer, "q.jsonl")[0]
    partial = tokenizer.decode(example["ids"][example["start"] : example["end"] + 1]).strip()
    assert partial == ("old mill," if kind == "word" else "ld mi")  # words are kept whole
    with raises_naming(TaskDataError, "record 1", "answer"):
        encode_spans([{**record, "answer_start": 5, "answer_text": " "}], tokenizer, "q.jsonl")


@pytest.mark.parametrize("pooling", ["mean", "document"])
def test_padding_changes_nothing_for_the_real_tokens(pooling):
    """With a bidirectional backbone, a document's span scores are the same unpadded and right-padded beside a
    longer one, and its class logits the same with 3 or 11 positions of left padding: no real token attends to
    filler."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0,
                         mem_len=8, bidirectional=True)  # fmt: skip
    lm = TransformerXLLM(config).eval()
    short, long = torch.randint(1, 20, (13,)), torch.randint(1, 20, (21,))

    def right_padded(docs, length):
        ids = torch.zeros(len(docs), length, dtype=torch.long)
        for row, d in enumerate(docs):
            ids[row, : len(d)] = d
        return ids, torch.arange(length) >= torch.tensor([len(d) for d in docs])[:, None]

    span = SpanExtractor(lm).eval()
    with torch.no_grad():
        alone = span(short[None], 8)["start_logits"]  # 13 tokens: segments of 8 and 5, no filler
        ids, pad = right_padded([short, long], 24)
        beside = span(ids, 8, padding=pad)["start_logits"]
    torch.testing.assert_close(alone[0], beside[0, :13], rtol=0, atol=1e-5)

    classifier = DocumentClassifier(lm, 3, pooling=pooling).eval()
    with torch.no_grad():
        ids, pad = right_padded([short.flip(0), long.flip(0)], 24)  # left padding: flip rows and columns back
        ids, pad = ids.flip(1), pad.flip(1)
        beside = classifier(ids, 8, padding=pad)["logits"][0]
        alone = classifier(ids[:1, 8:], 8, padding=pad[:1, 8:])["logits"][0]
    torch.testing.assert_close(alone, beside, rtol=0, atol=1e-5)


def test_a_task_file_with_invalid_utf8_names_the_file_and_line(tmp_path, capsys):
    from longseq.data.tasks import TaskDataError, read_jsonl

    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "fine", "label": 0}\n{"text": "caf\xe9", "label": 1}\n')
    with raises_naming(TaskDataError, "bad.jsonl:2", "UTF-8", "byte 14"):
        read_jsonl(str(path), "classify")


def test_an_unseen_character_in_a_task_file_names_the_file_and_record(tmp_path, lm_checkpoint, capsys):
    """An unseen character in a fine-tuning record said "at line 1, column 1" of the record's text alone."""
    data = tmp_path / "cls.jsonl"
    rows = [{"text": "abc cab", "label": 0}, {"text": "cab dZe", "label": 1}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    argv = ["finetune", "--task", "classify", "--data", str(data), "--checkpoint", lm_checkpoint,
            "--segment-len", "8", "--batch-size", "2", "--steps", "1", "--out", str(tmp_path / "ft"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert_names(err, str(data), "record 2", "'text'", "'Z'")
    assert "Traceback" not in err


def test_listops_with_a_bad_argument_or_an_interruption_leaves_existing_files_whole(tmp_path, capsys, monkeypatch):
    """``data listops --out DIR --min-length 100 --max-length 50`` truncated DIR/train.jsonl to nothing before the
    generator refused the lengths; ``--train -1`` wrote an empty train file and reported success."""
    base = ["data", "listops", "--out", str(tmp_path / "lo"), "--valid", "2", "--test", "2", "--quiet"]
    good = [*base, "--train", "4", "--min-length", "10", "--max-length", "60"]
    assert main(good) == 0
    files = {p.name: p.read_text() for p in (tmp_path / "lo").iterdir()}
    assert sorted(files) == ["test.jsonl", "train.jsonl", "valid.jsonl"] and len(files["train.jsonl"].splitlines()) == 4
    capsys.readouterr()
    assert main([*base, "--train", "4", "--min-length", "100", "--max-length", "50"]) == 2
    assert "min_length <= max_length" in capsys.readouterr().err
    assert main([*base, "--train", "-1"]) == 2
    assert_names(capsys.readouterr().err, "--train", "-1")
    interrupt_json_writes_after(5, monkeypatch)  # Ctrl-C in the middle of the second file
    assert main(good) == 130
    assert {p.name: p.read_text() for p in (tmp_path / "lo").iterdir()} == files


def test_labels_written_as_numbers_and_strings_are_one_class(tmp_path, lm_checkpoint, capsys):
    lm = lm_checkpoint
    rows = [{"text": "hh gfe abc", "label": [0, "0", 1, "1"][i % 4]} for i in range(8)]
    (tmp_path / "mixed.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = ["finetune", "--task", "classify", "--data", str(tmp_path / "mixed.jsonl"), "--checkpoint", lm,
            "--out", str(tmp_path / "ft"), "--steps", "2", "--segment-len", "8", "--batch-size", "4", "--quiet", "--json"]  # fmt: skip
    assert main(args) == 0
    assert last_json(capsys)["labels"] == ["0", "1"]


def test_a_grouped_batch_is_a_run_of_neighbours_in_length_order():
    lengths = np.random.default_rng(0).permutation(64).tolist()  # distinct lengths: ranks are the lengths
    batches = LengthGroupedBatches(lengths, batch_size=8, seed=3, pool=50)  # one pool holds every document
    for _ in range(2 * 8):  # two epochs
        picked = sorted(lengths[i] for i in batches.next())
        assert picked == list(range(picked[0], picked[0] + 8)) and picked[0] % 8 == 0


def test_grouped_batches_are_full_draw_each_document_at_most_once_an_epoch_and_cover_the_rest_later():
    lengths = np.random.default_rng(1).integers(1, 500, size=70).tolist()
    batches = LengthGroupedBatches(lengths, batch_size=8, seed=5, pool=2)
    seen = []
    for epoch in range(10):
        drawn = [batches.next() for _ in range(70 // 8)]
        assert all(len(b) == 8 for b in drawn)
        flat = [i for b in drawn for i in b]
        assert len(set(flat)) == len(flat) == 64 and batches.state_dict() == {"epoch": epoch + 1, "position": 0}
        seen += flat
    assert set(seen) == set(range(70))  # the 6 left over differ from epoch to epoch


def test_a_resumed_grouped_sampler_draws_the_same_batches():
    lengths = np.random.default_rng(2).integers(1, 500, size=50).tolist()
    whole = LengthGroupedBatches(lengths, batch_size=4, seed=7, pool=3)
    expected = [whole.next() for _ in range(30)]  # across an epoch boundary (12 batches an epoch)
    first = LengthGroupedBatches(lengths, batch_size=4, seed=7, pool=3)
    head = [first.next() for _ in range(17)]
    resumed = LengthGroupedBatches(lengths, batch_size=4, seed=7, pool=3)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + [resumed.next() for _ in range(13)] == expected


def test_the_sampler_follows_the_option_and_refuses_no_documents():
    options = TaskConfig(name="classify", train="x.jsonl", group_by_length=True)
    assert isinstance(training_batches([3, 1, 2], options, 2, 0), LengthGroupedBatches)
    assert not isinstance(
        training_batches([3, 1, 2], TaskConfig(name="classify", train="x.jsonl"), 2, 0), LengthGroupedBatches
    )
    assert len(LengthGroupedBatches([5, 6], batch_size=8, seed=0).next()) == 2  # fewer documents than a batch
    with pytest.raises(ConfigError, match="no training examples"):
        LengthGroupedBatches([], batch_size=8, seed=0)


def test_the_default_gradient_reaches_the_first_segment(tmp_path):
    """The label character 'a' sits only at position 0 of a 4-segment document: its embedding row gets a gradient
    from the classification loss with the default pooling, none with pooling=last."""
    train = label_first_documents(tmp_path / "train.jsonl", 6, seed=0, segments=(4, 4))
    grads = {}
    for pooling in (None, "last"):
        task = task_for(classify_run(train, pooling), ABC_TOKENIZER)
        task.run = task.prepare()
        torch.manual_seed(0)
        model = task.build_model()
        inputs = torch.as_tensor([ABC_TOKENIZER.encode("a" + "defghdef" * 3 + "ghdefgh").tolist()])  # 4 segments
        model(inputs, DOC_SEGMENT, torch.tensor([0]))["loss"].backward()
        grads[pooling] = model.lm.transformer.word_emb.emb_layers[0].weight.grad[ABC_TOKENIZER.index["a"]].norm()
    assert task_for(classify_run(train), ABC_TOKENIZER).options.pooling == "document"
    assert grads[None] > 1e-6 and grads["last"] == 0


def test_a_run_says_at_its_start_where_documents_are_longer_than_the_gradient_reaches(tmp_path):
    train = label_first_documents(tmp_path / "train.jsonl", 20, seed=1)
    said: list[str] = []
    task_for(classify_run(train, "last"), ABC_TOKENIZER, said.append).prepare()
    lengths = [len(json.loads(line)["text"]) for line in open(train)]
    (message,) = [m for m in said if "longer than" in m]
    longest = max(lengths)
    assert_names(
        message, "20 of 20", "segment_len 8", f"{longest} tokens", f"{-(-longest // 8)} segments", "mem_bptt=1"
    )
    beyond = sum(n > 8 + 2 * 8 for n in lengths)  # the final segment and two layers of an 8-token memory
    assert_names(message, f"and {beyond} are", "n_layer 2", "= 24")
    for quiet in (classify_run(train), classify_run(train, "last", mem_bptt=5)):  # document pooling; bptt over 5
        said.clear()
        task_for(quiet, ABC_TOKENIZER, said.append).prepare()
        assert not any("longer than" in m for m in said)
