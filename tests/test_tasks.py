"""Task heads and task data: a classification that needs the memory, BERT masking rates, JSONL errors, ListOps."""

import json
import statistics

import pytest
import torch

from longseq import ModelConfig
from longseq.data.tasks import TaskDataError, generate_listops, listops_value, read_jsonl
from longseq.model import TransformerXLLM
from longseq.model.heads import DocumentClassifier, SpanExtractor, best_spans, mask_tokens

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
    with pytest.raises(TaskDataError, match=r"train.jsonl:2: missing field 'label'"):
        read_jsonl(str(path), "classify")
    path.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 0\n')
    with pytest.raises(TaskDataError, match=r":3: not valid JSON"):
        read_jsonl(str(path), "classify")
    path.write_text(json.dumps({"context": "one two three", "question": "q", "answer_start": 4, "answer_text": "two"}))
    assert read_jsonl(str(path), "span")[0]["answer_text"] == "two"
    path.write_text(json.dumps({"context": "one two three", "question": "q", "answer_start": 0, "answer_text": "two"}))
    with pytest.raises(TaskDataError, match=r":1: answer_text is not found"):
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


def test_finetune_and_data_commands(tmp_path, capsys):
    from support import tiny_corpus, tiny_run

    from longseq.cli import main
    from longseq.train import train

    corpus = tiny_corpus()
    train(tiny_run(max_steps=2, eval_interval=2), str(tmp_path / "lm"), corpus=corpus, progress=False)
    rows = [
        {"text": "hh gfe " * 3 + ("abc" if i % 2 else "defg"), "label": "odd" if i % 2 else "even"} for i in range(12)
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = main(["finetune", "--task", "classify", "--data", str(tmp_path / "train.jsonl"), "--valid",
                 str(tmp_path / "train.jsonl"), "--checkpoint", str(tmp_path / "lm" / "last"), "--out",
                 str(tmp_path / "ft"), "--steps", "40", "--lr", "3e-3", "--batch-size", "4", "--segment-len", "8", "--json"])  # fmt: skip
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result["valid"]) == {"accuracy", "macro_f1"} and result["labels"] == ["even", "odd"]
    assert result["valid"]["accuracy"] == 1.0  # the last word decides the label
    assert (tmp_path / "ft" / "best" / "model.safetensors").exists() and (tmp_path / "ft" / "last").is_dir()
    seen = json.loads((tmp_path / "ft" / "last" / "trainer_state.json").read_text())["tokens_seen"]
    assert 40 * 4 * 24 <= seen <= 40 * 4 * 25  # tokens, not documents: each of the 4 a step has 24 or 25 characters
    (tmp_path / "bad.jsonl").write_text(json.dumps(rows[0]) + "\n" + '{"text": "x"}\n')
    code = main(["finetune", "--task", "classify", "--data", str(tmp_path / "bad.jsonl"), "--checkpoint",
                 str(tmp_path / "lm" / "last"), "--out", str(tmp_path / "ft2")])  # fmt: skip
    assert code == 2 and "bad.jsonl:2: missing field 'label'" in capsys.readouterr().err
    assert main(["data", "listops", "--out", str(tmp_path / "lo"), "--train", "5", "--valid", "2", "--test", "2",
                 "--min-length", "10", "--max-length", "100"]) == 0  # fmt: skip
    assert len(read_jsonl(str(tmp_path / "lo" / "train.jsonl"), "classify")) == 5


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
    with pytest.raises(TaskDataError, match="record 1: the answer is empty or overlaps no token"):
        encode_spans([{**record, "answer_start": 5, "answer_text": " "}], tokenizer, "q.jsonl")


def test_finetune_span_and_mlm_commands(tmp_path, capsys):
    from support import tiny_corpus, tiny_run

    from longseq.cli import main
    from longseq.train import train

    train(tiny_run(max_steps=2, eval_interval=2), str(tmp_path / "lm"), corpus=tiny_corpus(), progress=False)
    lm = str(tmp_path / "lm" / "last")
    rows = []
    for i in range(8):
        context = "hh gfe " * 4 + ("abc" if i % 2 else "fed") + " hh"
        rows.append({"question": "gfe", "context": context, "answer_start": 28, "answer_text": context[28:31]})
    (tmp_path / "span.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = main(["finetune", "--task", "span", "--data", str(tmp_path / "span.jsonl"), "--valid",
                 str(tmp_path / "span.jsonl"), "--checkpoint", lm, "--out", str(tmp_path / "span"), "--steps", "60",
                 "--lr", "3e-3", "--batch-size", "4", "--segment-len", "8", "--max-answer-len", "3", "--json"])  # fmt: skip
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["valid"]["exact_match"] >= 0.75  # the answer always sits at the same place
    assert json.loads((tmp_path / "span" / "best" / "config.json").read_text())["run"]["task"]["name"] == "span"

    (tmp_path / "mlm.jsonl").write_text("\n".join(json.dumps({"text": "hh gfe " * 6}) for _ in range(8)) + "\n")
    args = ["finetune", "--task", "mlm", "--data", str(tmp_path / "mlm.jsonl"), "--checkpoint", lm, "--out",
            str(tmp_path / "mlm"), "--batch-size", "4", "--segment-len", "8", "--json"]  # fmt: skip
    assert main(args) == 2 and "no spare symbol for [MASK]" in capsys.readouterr().err  # a char vocabulary
    results = []
    for steps, lr in (("1", "1e-5"), ("60", "3e-3")):  # untrained, then fine-tuned
        assert (
            main([*args, "--mask-token", "a", "--mask-rate", "0.3", "--steps", steps, "--lr", lr, "--overwrite"]) == 0
        )
        results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["train"])
    before, after = results
    assert 0.25 * 8 * 42 < after["masked_tokens"] < 0.35 * 8 * 42  # 30% of the 8 x 42 characters
    assert json.loads((tmp_path / "mlm" / "last" / "trainer_state.json").read_text())["tokens_seen"] == 60 * 4 * 42
    assert after["ppl"] < 0.7 * before["ppl"] and after["masked_accuracy"] > before["masked_accuracy"]


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


def test_predict_reproduces_what_fine_tuning_reported(tmp_path, capsys):
    """finetune then predict on the validation file: one output line per input line, and the same accuracy (the
    labels are noisy, so it is not 1), F1 and exact match; mlm fills exactly the [MASK] tokens."""
    import random

    from support import tiny_corpus, tiny_run

    from longseq.cli import main
    from longseq.train import train

    train(tiny_run(max_steps=2, eval_interval=2), str(tmp_path / "lm"), corpus=tiny_corpus(), progress=False)
    lm, rng = str(tmp_path / "lm" / "last"), random.Random(0)
    rows = [{"text": "hh gfe " * 3 + ("abc" if i % 2 else "defg"), "label": (i + (rng.random() < 0.2)) % 2}
            for i in range(40)]  # fmt: skip
    (tmp_path / "cls.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    common = ["--checkpoint", lm, "--steps", "30", "--lr", "3e-3", "--batch-size", "4", "--segment-len", "8",
              "--quiet", "--json"]  # fmt: skip
    cls = [
        "finetune",
        "--task",
        "classify",
        "--data",
        str(tmp_path / "cls.jsonl"),
        "--valid",
        str(tmp_path / "cls.jsonl"),
    ]
    assert main([*cls, *common, "--out", str(tmp_path / "ft")]) == 0
    reported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["valid"]
    assert 0.5 < reported["accuracy"] < 1.0
    assert main(["predict", "--checkpoint", str(tmp_path / "ft"), "--data", str(tmp_path / "cls.jsonl"), "--out",
                 str(tmp_path / "pred.jsonl"), "--json"]) == 0  # fmt: skip
    predicted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert predicted["accuracy"] == reported["accuracy"] and predicted["macro_f1"] == reported["macro_f1"]
    lines = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert len(lines) == 40 and all(p["prediction"] in ("0", "1") and set(p["scores"]) == {"0", "1"} for p in lines)

    spans = []
    for i in range(12):
        context = "hh gfe " * 4 + ("abc" if i % 2 else "fed") + " hh"
        spans.append({"question": "gfe", "context": context, "answer_start": 28, "answer_text": context[28:31]})
    (tmp_path / "span.jsonl").write_text("\n".join(json.dumps(r) for r in spans) + "\n")
    span = ["finetune", "--task", "span", "--data", str(tmp_path / "span.jsonl"), "--valid", str(tmp_path / "span.jsonl"),
            "--max-answer-len", "3"]  # fmt: skip
    assert main([*span, *common, "--out", str(tmp_path / "sp")]) == 0
    reported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["valid"]
    assert main(["predict", "--checkpoint", str(tmp_path / "sp" / "best"), "--data", str(tmp_path / "span.jsonl"),
                 "--out", str(tmp_path / "spans.jsonl"), "--json"]) == 0  # fmt: skip
    predicted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (predicted["exact_match"], predicted["f1"]) == (reported["exact_match"], reported["f1"])
    answers = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert all(a["prediction"] == spans[i]["context"][a["start"] : a["end"]] for i, a in enumerate(answers))

    (tmp_path / "mlm.jsonl").write_text("\n".join(json.dumps({"text": "hh gfe " * 6}) for _ in range(8)) + "\n")
    mlm = ["finetune", "--task", "mlm", "--data", str(tmp_path / "mlm.jsonl"), "--mask-token", "a"]
    assert main([*mlm, *common, "--out", str(tmp_path / "mlm")]) == 0
    capsys.readouterr()
    (tmp_path / "holes.jsonl").write_text(json.dumps({"text": "hh afe hh gfe ha"}) + "\n")
    assert main(["predict", "--checkpoint", str(tmp_path / "mlm"), "--data", str(tmp_path / "holes.jsonl"), "--out",
                 str(tmp_path / "filled.jsonl")]) == 0  # fmt: skip
    filled = json.loads((tmp_path / "filled.jsonl").read_text())
    assert len(filled["filled"]) == 2 and len(filled["prediction"]) == len("hh afe hh gfe ha")
    unmasked = [c for c, t in zip(filled["prediction"], "hh afe hh gfe ha") if t != "a"]
    assert "".join(unmasked) == "hh fe hh gfe h"  # only the [MASK] positions changed
