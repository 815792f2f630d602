"""Task heads and task data: a classification that needs the memory, BERT masking rates, JSONL errors, ListOps."""

import json
import statistics

import pytest
import torch

from longseq import ModelConfig
from longseq.data.tasks import TaskDataError, generate_listops, listops_value, read_jsonl
from longseq.model import TransformerXLLM
from longseq.model.heads import DocumentClassifier, mask_tokens

N_CLASSES, SEG, N_SEG = 4, 8, 6


def memory_task(n: int, seed: int):
    """The label is token 1 + c at the start of the first of six segments; everything else is noise (5..19)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, N_CLASSES, (n,), generator=g)
    docs = torch.randint(5, 20, (n, SEG * N_SEG), generator=g)
    docs[:, 0] = 1 + labels
    return docs, labels


def train_classifier(mem_len: int) -> float:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.0,
                         mem_len=mem_len)  # fmt: skip
    model = DocumentClassifier(TransformerXLLM(config), N_CLASSES, pooling="last")
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
    from test_train import tiny_corpus, tiny_run

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
    assert (tmp_path / "ft" / "model.safetensors").exists()
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
