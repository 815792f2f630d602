"""Fine-tuning an imported model with recurrence (``longseq finetune --task clm``, LoRA adapters, layer-wise decay,
classification over an imported model).

Claims, on a tiny random Llama that transformers saves and ``longseq convert`` imports: a language-model fine-tuning
run with the memory carried and back-propagated through 2 segments, LoRA adapters and layer-wise decay, killed by
SIGTERM inside a step and resumed, ends bit for bit where the uninterrupted run does (weights, training state, log);
LoRA trains the adapters alone (every base weight in its checkpoint is the imported one), learning rates decay by
layer, and its checkpoint loads merged, the plain model computing what the adapted one does, which ``eval`` reads
and ``convert --to-hf`` exports to a Llama that transformers runs with the same logits; full fine-tuning lowers the
text's validation loss below the imported model's; a classifier with document pooling over the imported model
learns a label the documents carry; what LoRA cannot take is refused by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from support import cli_json, raises_naming, records, tiny_llama_checkpoint

from longseq.api import finetune
from longseq.config import ConfigError
from longseq.config.task import TaskConfig
from longseq.tasks import task_for
from longseq.train import load_checkpoint
from longseq.train.checkpoint import load_checkpoint_config, load_weights
from longseq.train.optim import build_optimizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "fault_driver.py")
ENV = {**os.environ, "PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    return directory, tiny_llama_checkpoint(directory)


def clm_command(directory, base, out, *extra) -> list[str]:
    return ["finetune", "--task", "clm", "--data", str(directory / "text.txt"), "--checkpoint", base, "--out", str(out),
            "--steps", "6", "--batch-size", "2", "--segment-len", "16", "--lr", "3e-3", "--lora-rank", "4",
            "--layer-lr-decay", "0.7", "--eval-interval", "3", "--quiet",
            "--set", "mem_len=32", "mem_bptt=2", "lora_dropout=0.1", "eval_max_segments=4", *extra]  # fmt: skip


def test_a_clm_run_killed_by_sigterm_resumes_bit_for_bit(llama, tmp_path):
    directory, base = llama
    whole = subprocess.run([sys.executable, "-m", "longseq", *clm_command(directory, base, tmp_path / "whole")],
                           capture_output=True, text=True, env=ENV)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-2000:]
    cut_command = clm_command(directory, base, tmp_path / "cut")
    cut = subprocess.run([sys.executable, DRIVER, "backward", "4", "SIGTERM", "--", *cut_command],
                         capture_output=True, text=True, env=ENV)  # fmt: skip
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-2000:]
    assert [r["step"] for r in records(tmp_path / "cut") if "loss" in r] == [1, 2, 3, 4]  # the step it was in ended
    resumed = subprocess.run([sys.executable, "-m", "longseq", *cut_command, "--resume"],
                             capture_output=True, text=True, env=ENV)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    losses = [[(r["step"], r["loss"]) for r in records(tmp_path / run) if "loss" in r] for run in ("whole", "cut")]
    assert losses[0] == losses[1] and len(losses[0]) == 6
    for name in ("last/model.safetensors", "last/trainer.safetensors"):
        a, b = load_file(tmp_path / "whole" / name), load_file(tmp_path / "cut" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_lora_trains_the_adapters_alone_and_its_checkpoint_loads_merged(llama, tmp_path, capsys):
    directory, base = llama
    out = tmp_path / "lora"
    cli_json([*clm_command(directory, base, out), "--json"], capsys)
    imported = load_file(os.path.join(base, "model.safetensors"))
    saved = load_file(out / "last" / "model.safetensors")
    adapters = [k for k in saved if ".lora_" in k]
    assert adapters and all(k.split(".")[-4] in ("qkv_net", "o_net") for k in adapters)
    for name, tensor in saved.items():  # every base weight as imported, under the adapted linears' names
        if ".lora_" not in name:
            assert torch.equal(tensor, imported[name.replace(".base_layer", "")]), name
    assert any(not torch.equal(saved[k], torch.zeros_like(saved[k])) for k in adapters if "lora_B" in k)

    run = load_checkpoint_config(out / "last")
    adapted = task_for(run).build_model()
    load_weights(adapted, str(out / "last"))
    merged, _, _, _ = load_checkpoint(str(out / "last"))
    assert not any(".lora_" in name for name, _ in merged.named_parameters())
    x = torch.randint(0, 300, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, adapted.eval()(x).logits, rtol=0, atol=1e-5)

    cli_json(["convert", "--to-hf", "--format", "llama", "--checkpoint", str(out / "last"),
              "--out", str(tmp_path / "hf"), "--json", "--quiet"], capsys)  # fmt: skip
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(x).logits, merged(x).logits, rtol=0, atol=1e-4)
    result = cli_json(["eval", "--checkpoint", str(out / "last"), "--data", str(directory / "text.txt"), "--json",
                       "--quiet", "--set", "max_segments=2"], capsys)  # fmt: skip
    assert result["tokens"] > 0


def test_the_adapters_learning_rates_decay_by_layer(llama):
    directory, base = llama
    run = load_checkpoint_config(base)
    options = TaskConfig(name="clm", train=str(directory / "text.txt"), lora_rank=2)
    from longseq.config import RunConfig

    tuned = RunConfig(run.model, run.data, run.train.replace(layer_lr_decay=0.5), options)
    model = task_for(tuned).build_model()
    from longseq.tasks.base import set_trainable

    set_trainable(model, task_for(tuned).trainable(model))
    groups = build_optimizer(model, tuned.train).param_groups
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    names = dict(model.named_parameters())
    layer0 = scale[id(names["transformer.stack.layers.0.dec_attn.qkv_net.lora_A.default.weight"])]
    layer1 = scale[id(names["transformer.stack.layers.1.dec_attn.qkv_net.lora_A.default.weight"])]
    assert (layer0, layer1) == (0.5**2, 0.5)  # top = n_layer + 1 = 3: layer i at depth i + 1
    assert all(".lora_" in n for n, p in names.items() if p.requires_grad)


def test_full_fine_tuning_lowers_the_texts_validation_loss(llama, tmp_path):
    directory, base = llama
    settings = dict(steps=30, batch_size=4, segment_len=16, lr=3e-3, mem_len=32, eval_max_segments=8)
    result = finetune(base, str(tmp_path / "full"), task="clm", train=str(directory / "text.txt"), **settings)
    before = finetune(base, str(tmp_path / "none"), task="clm", train=str(directory / "text.txt"),
                      **{**settings, "steps": 1, "lr": 1e-12})  # fmt: skip
    assert result["valid"]["loss"] < 0.7 * before["valid"]["loss"]


def test_a_classifier_over_the_imported_model_learns_a_label(llama, tmp_path):
    directory, base = llama
    rows = [{"text": ("abc " if i % 2 else "hh ") + "defg gfe " * 8, "label": i % 2} for i in range(24)]
    path = tmp_path / "cls.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = finetune(base, str(tmp_path / "cls"), task="classify", train=str(path), valid=str(path), steps=40,
                      batch_size=8, segment_len=8, lr=3e-3, pooling="document")  # fmt: skip
    assert result["valid"]["accuracy"] == 1.0  # the label is the first word, several segments before the end


def test_what_lora_cannot_take_is_refused_by_name(llama, tmp_path):
    directory, base = llama
    text = str(directory / "text.txt")
    with raises_naming(ConfigError, "lora_targets", "attn_proj", "qkv_net"):
        finetune(base, str(tmp_path / "a"), task="clm", train=text, steps=1, lora_rank=2, lora_targets="attn_proj")
    with raises_naming(ConfigError, "lora_rank", "head_only"):
        finetune(base, str(tmp_path / "b"), task="clm", train=text, steps=1, lora_rank=2, head_only=True)
