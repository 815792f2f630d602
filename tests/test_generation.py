"""The command line end to end on a tiny run, sampling with memory, and config handling."""

import json

import pytest
import torch

from longseq import ConfigError, ModelConfig, TransformerXLLM, get_preset
from longseq.cli import main
from longseq.config import DataConfig, RunConfig, TrainConfig, apply_overrides
from longseq.generation import filter_logits, generate

TINY = [
    "--set", "max_steps=4", "eval_interval=2", "eval_max_segments=2", "n_layer=1", "d_model=16", "n_head=2",
    "d_head=8", "d_inner=32", "batch_size=2", "tgt_len=16", "eval_tgt_len=16", "eval_batch_size=2", "mem_len=16",
]  # fmt: skip


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cli_train_eval_generate(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, "--json", "--quiet", *TINY]) == 0
    result = last_json(capsys)
    for key in ("loss", "ppl", "tokens", "tokens_per_s", "bpc", "unigram_bpc"):
        assert key in result
    assert result["tokens"] == 4 * 2 * 16
    assert (
        main(["eval", "--checkpoint", f"{out}/best", "--json", "--quiet", "--set", "max_segments=3", "mem_len=48"]) == 0
    )
    metrics = last_json(capsys)
    assert metrics["tokens"] == 3 * 2 * 16 and metrics["bpc"] == pytest.approx(metrics["loss"] / 0.6931471805599453)
    args = ["generate", "--checkpoint", f"{out}/best", "--prompt", "ROMEO:", "--max-new-tokens", "12", "--json"]
    assert main([*args, "--seed", "3"]) == 0
    first = last_json(capsys)
    assert main([*args, "--seed", "3"]) == 0
    assert last_json(capsys)["text"] == first["text"] and len(first["text"]) == 12
    # resume continues to a larger max_steps
    assert main(["train", "--out", out, "--resume", "--json", "--quiet", "--set", "max_steps=6"]) == 0
    assert last_json(capsys)["step"] == 6


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--preset", "wt-103"], "unknown preset 'wt-103'"),
        (["train", "--set", "mem_lenn=3"], "did you mean mem_len"),
        (["train", "--set", "lr=fast"], "lr: expected a number"),
        (["train", "--set", "dropout"], "key=value"),
        (["eval", "--checkpoint", "/nonexistent/ckpt"], "does not exist"),
        (["eval", "--checkpoint", ".", "--set", "window=3"], "unknown config key 'window'"),
    ],
)
def test_cli_errors_are_one_clear_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_generation_with_memory_equals_recomputing_the_context():
    torch.manual_seed(0)
    model = TransformerXLLM(
        ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=64)
    ).eval()
    prompt = torch.randint(0, 20, (2, 13))
    fast = generate(model, prompt, 10, temperature=0, mem_len=64, segment_len=5)
    context = prompt
    for _ in range(10):  # naive: rerun the whole context for every token, no memory
        logits = model(context, mem_len=0).logits[:, -1]
        context = torch.cat([context, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(fast, context[:, 13:])


def test_top_k_and_top_p_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.9)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.1)).tolist() == [[False, True, True, True]]


def test_configs_round_trip_and_reject_unknown_keys():
    for name in ("tiny-shakespeare", "enwik8-base", "text8-base", "wt103-base", "ptb"):
        run = get_preset(name)
        again = RunConfig.from_dict(json.loads(json.dumps(run.to_dict())))
        assert again == run
    with pytest.raises(ConfigError, match="unknown ModelConfig key"):
        ModelConfig.from_dict({"n_layers": 3})
    with pytest.raises(ConfigError, match="cutoffs"):
        ModelConfig(vocab_size=100, cutoffs=[50, 40])
    sections = apply_overrides(
        {"model": ModelConfig(), "data": DataConfig(), "train": TrainConfig()},
        ["cutoffs=10,20", "same_length=true", "model.dropout=0.3", "lr=1e-4", "d_embed=none"],
    )
    assert sections["model"].cutoffs == [10, 20] and sections["model"].memory.same_length is True
    assert sections["model"].dropout == 0.3 and sections["train"].lr == 1e-4
    with pytest.raises(ConfigError, match="must be >= 1"):
        apply_overrides({"model": ModelConfig()}, ["n_layer=0"])
    for bad, message in (("weight_decay=-1", "weight_decay must be >= 0"), ("beta1=1.5", r"beta1 must be in \[0, 1\)"),
                         ("beta2=1", "beta2 must be in"), ("eps=0", "eps must be > 0")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):  # accepted, or left to torch's message, before
            apply_overrides({"train": TrainConfig()}, [bad])


def test_bench_cli_reports_each_task(capsys):
    small = ["--tgt-len", "8", "--mem-len", "16", "--batch", "2", "--steps", "1"]
    assert main(["bench", "train", *small, "--json"]) == 0
    train = last_json(capsys)
    assert train["task"] == "train" and train["tokens_per_s"] > 0 and train["peak_rss_mb"] > 0
    assert main(["bench", "eval", *small, "--json"]) == 0
    assert last_json(capsys)["ms_per_token"] > 0
    assert (
        main(["bench", "generate", *small, "--prompt-len", "20", "--new-tokens", "5", "--device", "cpu", "--json"]) == 0
    )
    generated = last_json(capsys)
    assert generated["tokens_per_s"] > 0 and generated["device"] == "cpu" and train["device"] == "cpu"
    if not torch.cuda.is_available():  # --device cuda where there is no GPU: one line that says so
        assert main(["bench", "eval", *small, "--device", "cuda", "--json"]) == 2
        assert "no GPU that torch can use" in capsys.readouterr().err


def test_generate_restores_the_training_mode_and_checks_mem_len():
    model = TransformerXLLM(ModelConfig(vocab_size=20, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32)).train()
    generate(model, torch.randint(0, 20, (1, 4)), 3)
    assert model.training
    with pytest.raises(ValueError, match="mem_len must be >= 0"):
        generate(model, torch.randint(0, 20, (1, 4)), 3, mem_len=-3)
