"""The ``longseq`` model of the LM evaluation harness: its scores are longseq's own, through every request type.

All offline: a tiny random checkpoint, and a harness task defined in a temporary directory over a local JSONL file.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from support import cli_json  # noqa: E402

from longseq.cli import main  # noqa: E402
from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from longseq.data.tokenizers import ByteTokenizer  # noqa: E402
from longseq.eval.evaluate import evaluate  # noqa: E402
from longseq.integrations.harness import LongseqLM  # noqa: E402
from longseq.model import TransformerXLLM  # noqa: E402
from longseq.train.checkpoint import save_checkpoint  # noqa: E402

DOCS = [
    "The memory carries the past from one segment to the next.",
    "Short one.",
    "A third document, long enough to need four segments of sixteen bytes each.",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random two-layer byte model (memory 12, evaluation segments of 16 bytes) saved as a checkpoint."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=256, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=12)
    run = RunConfig(config, DataConfig(tokenizer="byte", eval_tgt_len=16, eval_batch_size=1), TrainConfig())
    path = tmp_path_factory.mktemp("lm_eval") / "ckpt"
    save_checkpoint(str(path), TransformerXLLM(config), run, ByteTokenizer())
    return str(path)


@pytest.fixture(scope="module")
def lm(checkpoint):
    return LongseqLM(checkpoint, device="cpu")


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_rolling_loglikelihood_is_longseq_eval_on_the_same_text(lm, checkpoint, tmp_path, capsys):
    """A document's rolling log-likelihood is minus ``longseq eval``'s total NLL (loss x tokens) over a test split
    holding the newline (the prefix token) and the document: the same segments, memory carried."""
    document = " ".join(DOCS)  # 4+ segments: the memory is carried and truncated
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text("\n" + document)
    assert main(["eval", "--checkpoint", checkpoint, "--data", str(tmp_path), "--split", "test", "--device", "cpu",
                 "--json", "--quiet", "--set", "batch_size=1"]) == 0  # fmt: skip
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (rolling,) = lm.loglikelihood_rolling([request("loglikelihood_rolling", document)], disable_tqdm=True)
    assert scored["tokens"] == len(document.encode())
    assert rolling == pytest.approx(-scored["loss"] * scored["tokens"], rel=1e-9, abs=1e-6)


def test_each_document_is_scored_from_an_empty_memory(lm):
    """Several documents: each one's rolling score is evaluate() over that document alone."""
    scores = lm.loglikelihood_rolling([request("loglikelihood_rolling", d) for d in DOCS], disable_tqdm=True)
    for document, score in zip(DOCS, scores):
        ids = np.frombuffer(("\n" + document).encode(), dtype=np.uint8).astype(np.int64)
        alone = evaluate(lm.model, ids, batch_size=1, tgt_len=16)
        assert score == pytest.approx(-alone["loss"] * alone["tokens"], rel=1e-6)


def test_loglikelihood_adds_up_to_the_rolling_score(lm):
    """log p(context) + log p(continuation | context) = log p(context + continuation), the continuation read after
    a context that fills several segments (memory carried), and an empty context reads the prefix token."""
    context, continuation = DOCS[2][:40], DOCS[2][40:]
    (whole,) = lm.loglikelihood_rolling([request("loglikelihood_rolling", DOCS[2])], disable_tqdm=True)
    (head, _), (tail, _) = lm.loglikelihood(
        [request("loglikelihood", "", context), request("loglikelihood", context, continuation)], disable_tqdm=True
    )
    assert head + tail == pytest.approx(whole, rel=1e-5)


def test_greedy_generation_is_greedy_by_the_scores(lm):
    """``generate_until`` (greedy) makes text that ``loglikelihood`` calls greedy, and it stops before ``until``."""
    context = DOCS[0][:30]
    (free,) = lm.generate_until([request("generate_until", context, {"max_gen_toks": 12})], disable_tqdm=True)
    assert len(free.encode("utf-8", errors="surrogateescape")) <= 12
    assert lm.loglikelihood([request("loglikelihood", context, free)], disable_tqdm=True)[0][1] is True
    stop = free[len(free) // 2]
    (cut,) = lm.generate_until(
        [request("generate_until", context, {"max_gen_toks": 12, "until": [stop]})], disable_tqdm=True
    )
    assert cut == free[: free.index(stop)]


def test_unknown_arguments_are_refused_by_name(checkpoint, lm):
    with pytest.raises(ValueError, match="memlen"):
        LongseqLM(checkpoint, device="cpu", memlen=3)
    with pytest.raises(ValueError, match="num_beams"):
        lm.generate_until([request("generate_until", "x", {"num_beams": 2})], disable_tqdm=True)


@pytest.mark.parametrize(
    "args, words",
    [({"tgt_len": "-1"}, ("tgt_len", ">= 1", "-1")), ({"tgt_len": 0}, ("tgt_len", ">= 1", "0")),
     ({"tgt_len": "abc"}, ("tgt_len", "'abc'", "integer")), ({"max_gen_toks": "-1"}, ("max_gen_toks", "-1")),
     ({"mem_len": -3}, ("mem_len", ">= 0")), ({"tgt_len": 2.5}, ("tgt_len", "2.5"))],
)  # fmt: skip
def test_model_args_out_of_range_are_refused_by_name_when_the_model_is_made(checkpoint, args, words):
    """tgt_len=-1 scored every document at log-likelihood 0 (perplexity 1), tgt_len=0 meant the default, tgt_len=abc
    named no key, max_gen_toks=-1 failed only at the first generation."""
    with pytest.raises(ValueError) as caught:
        LongseqLM(checkpoint, device="cpu", **args)
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_generation_arguments_are_checked_and_top_p_zero_is_not_off(lm):
    """``top_p: 0`` sampled from the whole vocabulary (``top_p or 1.0``); a request's max_gen_toks=-1 was read as
    none."""
    for kwargs, word in (({"do_sample": True, "top_p": 0}, "top_p"), ({"max_gen_toks": -1}, "max_gen_toks"),
                         ({"do_sample": True, "temperature": -1}, "temperature")):  # fmt: skip
        with pytest.raises(ValueError, match=word):
            lm.generate_until([request("generate_until", "abc", {"until": ["\n\n"], **kwargs})], disable_tqdm=True)
    one = lm.generate_until([request("generate_until", "abc", {"until": [], "do_sample": True, "top_p": 1e-9,
                                                               "max_gen_toks": 6})], disable_tqdm=True)  # fmt: skip
    greedy = lm.generate_until([request("generate_until", "abc", {"until": [], "max_gen_toks": 6})], disable_tqdm=True)
    assert one == greedy  # a nucleus of (almost) no mass keeps the most likely token only: greedy


TASK = """task: longseq_local_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def test_the_harness_runs_a_local_task(lm, checkpoint, tmp_path, monkeypatch):
    """``simple_evaluate`` through the registered name, a task defined in a directory over a JSONL file: its
    bits per byte are the documents' rolling NLL over their UTF-8 bytes."""
    lm_eval = pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local.yaml").write_text(TASK.format(data=data))
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="longseq", model_args=f"checkpoint={checkpoint}", device="cpu", tasks=["longseq_local_ppl"],
        task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False), log_samples=False,
    )  # fmt: skip
    scores = lm.loglikelihood_rolling([request("loglikelihood_rolling", d) for d in DOCS], disable_tqdm=True)
    expected = -sum(scores) / sum(len(d.encode()) for d in DOCS) / math.log(2)
    assert results["results"]["longseq_local_ppl"]["bits_per_byte,none"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow  # the harness's command indexes every task it ships first: 15-50 s here
def test_the_lm_eval_command_scores_a_checkpoint(lm, checkpoint, tmp_path, monkeypatch):
    """``python -m longseq.lm_eval --model longseq ...`` (run in this process): the harness's own command line
    writes the same bits per byte as the model's rolling scores."""
    import sys

    from longseq.integrations.harness import main as lm_eval_main

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["lm_eval"])  # restored after the test: main sets it
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local.yaml").write_text(TASK.format(data=data))
    lm_eval_main(["--model", "longseq", "--model_args", f"checkpoint={checkpoint}", "--tasks", "longseq_local_ppl",
                  "--include_path", str(tmp_path / "tasks"), "--device", "cpu", "--output_path", str(tmp_path / "out")])  # fmt: skip
    (written,) = list((tmp_path / "out").rglob("results_*.json"))
    scores = lm.loglikelihood_rolling([request("loglikelihood_rolling", d) for d in DOCS], disable_tqdm=True)
    expected = -sum(scores) / sum(len(d.encode()) for d in DOCS) / math.log(2)
    bpb = json.loads(written.read_text())["results"]["longseq_local_ppl"]["bits_per_byte,none"]
    assert bpb == pytest.approx(expected, rel=1e-9)


PAIRS = [("", "The memory"), ("The memory", " carries"), ("Short", " one."), ("naïve", " café\n")]  # one window


def test_the_harness_hf_model_scores_an_export_as_longseq(lm, checkpoint, tmp_path, capsys):
    """The harness's own ``hf`` model over ``longseq convert --to-hf`` of the checkpoint (``import longseq.hf``
    registers it, as ``python -m longseq.lm_eval`` does): where the text fits one segment, the log-likelihoods and
    greedy flags are the ``longseq`` model's.  The prefix token is the newline, as longseq's model reads: the id
    ``convert`` prints (10 for bytes)."""
    pytest.importorskip("transformers", minversion="5")
    from lm_eval.models.huggingface import HFLM

    import longseq.hf  # noqa: F401

    argv = ["convert", "--to-hf", "--checkpoint", checkpoint, "--out", str(tmp_path / "hf"), "--json"]
    prefix = cli_json(argv, capsys)["lm_eval_prefix_token_id"]
    assert prefix == lm.eot_token_id == 10
    hf = HFLM(pretrained=str(tmp_path / "hf"), device="cpu", batch_size=2, prefix_token_id=prefix)
    requests = [request("loglikelihood", context, continuation) for context, continuation in PAIRS]
    theirs = hf.loglikelihood(requests, disable_tqdm=True)
    ours = lm.loglikelihood(requests, disable_tqdm=True)
    assert [g for _, g in theirs] == [g for _, g in ours]
    assert [s for s, _ in theirs] == pytest.approx([s for s, _ in ours], rel=1e-5)


def test_the_hf_model_scores_a_word_export_as_longseq(tmp_path, capsys):
    """A word model's export: the ``hf`` model's rolling log-likelihoods and continuations are the ``longseq``
    model's (texts of one segment), with the prefix the export's tokenizer names (``<eos>``, the word model's
    newline: what ``convert`` prints for ``prefix_token_id``; 10 is a word here).  Its tokenizer ended every text with ``<eos>``: a request scored one ``<eos>``
    more than its text (issue 60 measured word perplexity 38,364 against 7,733) and a context's ``<eos>`` took
    the continuation's first word; an export written so is named when it loads."""
    pytest.importorskip("transformers", minversion="5")
    from lm_eval.models.huggingface import HFLM
    from tokenizers import Regex, normalizers
    from tokenizers import Tokenizer as HFTokenizer

    import longseq.hf  # noqa: F401
    from longseq.data.tokenizers import WordTokenizer

    word = WordTokenizer.build("the cat sat on the mat\nthe dog ate the hat\n")
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=word.vocab_size, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32,
                         mem_len=12, init_std=0.3)  # fmt: skip
    run = RunConfig(config, DataConfig(tokenizer="word", eval_tgt_len=16, eval_batch_size=1), TrainConfig())
    save_checkpoint(str(tmp_path / "ckpt"), TransformerXLLM(config), run, word)
    argv = ["convert", "--to-hf", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"), "--json"]
    assert cli_json(argv, capsys)["lm_eval_prefix_token_id"] == word.index["<eos>"] != 10
    ours = LongseqLM(str(tmp_path / "ckpt"), device="cpu")
    theirs = HFLM(pretrained=str(tmp_path / "hf"), device="cpu", batch_size=2)  # no prefix_token_id: its <eos>
    assert theirs.prefix_token_id == ours.eot_token_id == word.index["<eos>"]
    rolling = [request("loglikelihood_rolling", text) for text in ("the cat sat on the mat", "the dog ate\nthe hat")]
    assert theirs.loglikelihood_rolling(rolling, disable_tqdm=True) == pytest.approx(
        ours.loglikelihood_rolling(rolling, disable_tqdm=True), rel=1e-5
    )
    pairs = [request("loglikelihood", "the cat", " sat on"), request("loglikelihood", "the dog ate\n", "the hat")]
    assert [s for s, _ in theirs.loglikelihood(pairs, disable_tqdm=True)] == pytest.approx(
        [s for s, _ in ours.loglikelihood(pairs, disable_tqdm=True)], rel=1e-5
    )
    old = HFTokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))  # as exports were written before
    old.normalizer = normalizers.Sequence([normalizers.Replace(Regex(r"\n?\z"), "\n"), old.normalizer])
    old.save(str(tmp_path / "hf" / "tokenizer.json"))
    with pytest.warns(UserWarning, match="tokenizer.json ends every text with <eos>.*convert --to-hf"):
        longseq.hf.LongseqForCausalLM.from_pretrained(str(tmp_path / "hf"))


CHOICE_TASK = """task: longseq_local_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: 0
target_delimiter: ""
metric_list:
  - metric: acc
"""


@pytest.mark.slow  # two runs of the harness's command, each indexing every task it ships: 30-100 s here
def test_the_launcher_loads_an_export_with_the_hf_model(checkpoint, tmp_path):
    """``python -m longseq.lm_eval --model hf --model_args pretrained=HF_DIR`` (a fresh process: the launcher
    registers longseq with transformers) logs the log-likelihoods that ``--model longseq`` logs."""
    import os
    import subprocess
    import sys

    assert main(["convert", "--to-hf", "--checkpoint", checkpoint, "--out", str(tmp_path / "hf")]) == 0
    data = tmp_path / "choices.jsonl"
    rows = [{"context": c, "choices": [x, " other"]} for c, x in PAIRS[1:]]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "choice.yaml").write_text(CHOICE_TASK.format(data=data))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "c")}
    logged = {}
    for name, args in (
        ("hf", f"pretrained={tmp_path / 'hf'},prefix_token_id=10"),
        ("longseq", f"checkpoint={checkpoint}"),
    ):
        command = [sys.executable, "-m", "longseq.lm_eval", "--model", name, "--model_args", args, "--device", "cpu",
                   "--tasks", "longseq_local_choice", "--include_path", str(tmp_path / "tasks"), "--log_samples",
                   "--output_path", str(tmp_path / name)]  # fmt: skip
        subprocess.run(command, check=True, env=env, cwd=tmp_path, capture_output=True)
        (samples,) = list((tmp_path / name).rglob("samples_*.jsonl"))
        logged[name] = [
            [float(r[0]) for r in json.loads(line)["filtered_resps"]] for line in samples.read_text().splitlines()
        ]
    assert len(logged["hf"]) == len(rows)
    assert logged["hf"] == [pytest.approx(x, rel=1e-5) for x in logged["longseq"]]
