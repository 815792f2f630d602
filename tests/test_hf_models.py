"""longseq models in transformers 5 (``import longseq.hf``): what AutoModelForCausalLM loads computes what longseq
computes, and ``generate()`` draws the tokens ``longseq generate`` draws for the same seed."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"longseq.hf needs transformers 5, this is {transformers.__version__}", allow_module_level=True)

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

import longseq.hf  # noqa: E402, F401  (registers the classes)
from longseq import ModelConfig, RunConfig  # noqa: E402
from longseq.cli import main  # noqa: E402
from longseq.config import ConfigError, DataConfig, TrainConfig  # noqa: E402
from longseq.data.tokenizers import ByteTokenizer, load_tokenizer  # noqa: E402
from longseq.generation import generate  # noqa: E402
from longseq.hf import LongseqConfig, LongseqForCausalLM  # noqa: E402
from longseq.interop.hf_longseq import export_longseq_hf  # noqa: E402
from longseq.model import build_model  # noqa: E402
from longseq.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

BASE = dict(vocab_size=50, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=6, dropout=0.0)
CONFIGS = {  # every attention pattern, every mixer, hourglass, the memory policies, adaptive softmax, the baselines
    "xl-adaptive-untied": dict(cutoffs=[10, 30], div_val=2, d_embed=16, untie_r=True, same_length=True, clamp_len=4),
    "window-dilated": dict(attention=["window", "dilated"], window=3, dilation=[1, 2]),
    "strided-blocksparse": dict(attention=["strided", "block_sparse"], stride=3, window=2, block_size=2),
    "bigbird-global": dict(attention=["bigbird", "global"], window=2, block_size=2, num_global=1, num_random_blocks=1),
    "mixers-shaw": dict(n_layer=4, mixer=["ssm", "attention", "conv", "rnn"], head_dim=8, pos="shaw"),
    "linear-family": dict(n_layer=5, mixer=["retention", "attention", "delta", "gla", "performer"], chunk=4),
    "hourglass": dict(n_layer=4, shorten_layers=[1, 3], cutoffs=[20], div_val=1),
    "learned-chunks": dict(n_layer=4, shorten_layers=[1, 3], boundaries="learned"),
    "entropy-chunks": dict(n_layer=4, shorten_layers=[1, 3], boundaries="entropy", entropy_rule="relative"),
    "compressed-tokens-int8": dict(cmem_len=4, cmem_rate=2, cmem_fn="linear", mem_tokens=2, mem_quant="int8"),
    "absolute-no-memory": dict(pos="absolute", mem_len=0),
    "lstm": dict(arch="lstm"),
}
SEGMENT = 4  # the prompt (7 tokens) is read in two segments, the second one short


def tiny(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(**{**BASE, **CONFIGS[name]})).eval()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_auto_model_computes_and_samples_as_longseq(name, tmp_path):
    model = tiny(name)
    export_longseq_hf(model, str(tmp_path / "hf"), segment_len=SEGMENT, generate_mem_len=9)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert isinstance(hf, LongseqForCausalLM) and hf.num_parameters() == model.num_parameters()
    x = torch.randint(0, 50, (2, 7))
    first, rest = x[:, :5], x[:, 5:]
    with torch.no_grad():
        ours = model(first)
        out = hf(first)
        assert torch.equal(out.logits, ours.logits)
        assert torch.equal(hf(rest, cache=out.cache).logits, model(rest, ours.mems).logits)  # the cache is the memory
        shifted = torch.cat([x[:, 1:], torch.full((2, 1), -100)], dim=1)  # transformers shifts; longseq's are shifted
        assert torch.allclose(hf(x, labels=x).loss, model(x, labels=shifted).loss, atol=1e-6, rtol=0)
    sampling = dict(recurrence=model.config.recurrence(mem_len=9), segment_len=SEGMENT)
    greedy = hf.generate(x, max_new_tokens=6, do_sample=False)
    assert torch.equal(greedy[:, :7], x) and torch.equal(
        greedy[:, 7:], generate(model, x, 6, temperature=0, **sampling)
    )
    torch.manual_seed(1)  # generate() draws from torch's default generator, longseq from its own: the same stream
    drawn = hf.generate(x, max_new_tokens=6)[:, 7:]  # sampling at temperature 1, no top-k: longseq's defaults
    assert torch.equal(drawn, generate(model, x, 6, generator=torch.Generator().manual_seed(1), **sampling))


@pytest.mark.parametrize("options", [{"temperature": 0.7, "top_k": 5}, {"top_p": 0.8}, {"top_k": 3, "top_p": 0.5}])
def test_filters_sample_as_longseq(options):
    """transformers' temperature, top-k and top-p warpers keep the tokens longseq's filter_logits keeps."""
    model = tiny("xl-adaptive-untied")
    hf = longseq.hf.from_longseq(model, segment_len=SEGMENT, generate_mem_len=9)
    x = torch.randint(0, 50, (3, 7))
    torch.manual_seed(2)
    drawn = hf.generate(x, max_new_tokens=8, **options)[:, 7:]
    expected = generate(
        model,
        x,
        8,
        generator=torch.Generator().manual_seed(2),
        recurrence=model.config.recurrence(mem_len=9),
        segment_len=SEGMENT,
        **options,
    )
    assert torch.equal(drawn, expected)


def test_save_pretrained_writes_what_convert_writes(tmp_path):
    model = tiny("xl-adaptive-untied")
    export_longseq_hf(model, str(tmp_path / "exported"), segment_len=SEGMENT)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "exported"))
    hf.save_pretrained(str(tmp_path / "saved"))
    exported, saved = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("exported", "saved"))
    assert set(exported) == set(saved) and all(torch.equal(exported[k], saved[k]) for k in exported)
    assert "model.crit.out_layers.0.weight" not in saved  # tied to the embedding: stored once
    configs = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("exported", "saved")]
    assert configs[0]["longseq"] == configs[1]["longseq"] == model.config.to_dict()
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "saved"))
    for (name, a), b in zip(hf.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    assert again.model.crit.out_layers[0].weight is again.model.transformer.word_emb.emb_layers[0].weight


def test_cli_export_generates_the_cli_tokens(tmp_path, capsys):
    """``longseq convert --to-hf`` then ``generate()`` with the seed gives ``longseq generate --seed``'s text."""
    tokenizer = ByteTokenizer()
    model = build_model(ModelConfig(**{**BASE, "vocab_size": 256})).eval()
    run = RunConfig(model=model.config, data=DataConfig(tokenizer="byte", tgt_len=5), train=TrainConfig())
    save_checkpoint(str(tmp_path / "ck"), model, run, tokenizer)
    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]) == 0
    args = ["--checkpoint", str(tmp_path / "ck"), "--prompt", "hello world", "--max-new-tokens", "12", "--json"]
    assert main(["generate", *args, "--seed", "5", "--top-k", "40"]) == 0
    expected = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert (hf.config.segment_len, hf.config.sampling_mem_len) == (5, model.config.memory.mem_len + 5)
    saved = load_tokenizer(str(tmp_path / "hf" / "longseq_tokenizer.json"))
    ids = torch.as_tensor(saved.encode("hello world").tolist())[None]
    torch.manual_seed(5)
    assert saved.decode(hf.generate(ids, max_new_tokens=12, top_k=40)[0, ids.size(1) :].tolist()) == expected
    hf.save_pretrained(str(tmp_path / "saved"))  # the tokenizer it was loaded with, written again
    for directory in ("hf", "saved"):  # and back into a longseq checkpoint, bit for bit
        assert (
            main(["convert", "--from-hf", str(tmp_path / directory), "--out", str(tmp_path / f"{directory}-back")]) == 0
        )
        back, back_tokenizer, back_run, _ = load_checkpoint(str(tmp_path / f"{directory}-back"))
        assert back_tokenizer.kind == "byte" and back_run.data.tgt_len == 5 and back_run.model == run.model
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


def test_bad_input_is_refused_clearly(tmp_path):
    hf = longseq.hf.from_longseq(tiny("window-dilated"), segment_len=SEGMENT)
    x = torch.randint(0, 50, (2, 5))
    assert torch.equal(hf(x, attention_mask=torch.ones_like(x)).logits, hf(x).logits)
    with pytest.raises(TypeError, match="does not take"):
        hf(x, position_ids=torch.arange(5)[None])
    with pytest.raises(ConfigError, match="n_layers"):
        LongseqConfig(longseq={"n_layers": 2})
    with pytest.raises(ValueError, match="vocab_size=7 disagrees"):
        LongseqConfig(longseq=BASE, vocab_size=7)
    export_longseq_hf(tiny("window-dilated"), str(tmp_path / "hf"))
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    del weights["model.transformer.stack.layers.1.pos_ff.core_net.0.weight"]
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"lacks 1 tensor\(s\) of the model: model\.transformer\.stack\.layers\.1\.pos_ff"
    ):
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    hf.config.save_pretrained(str(tmp_path))
    assert isinstance(AutoConfig.from_pretrained(str(tmp_path)), LongseqConfig)
    assert os.path.isfile(tmp_path / "config.json")


@pytest.mark.parametrize("name", ["xl-adaptive-untied", "mixers-shaw", "compressed-tokens-int8"])
def test_an_export_of_older_weight_names_loads_computes_and_saves_todays(name, tmp_path):
    """An export written before the backbone held its layer stack (``model.transformer.layers.*``, u and v and the
    memory policies under ``model.transformer.``) and before the positions were modules (``dec_attn.r_net``,
    ``dec_attn.rel_table``): ``from_pretrained`` and longseq's own reader load it and compute what the model
    computes, and ``save_pretrained`` writes today's names."""
    from longseq.interop.hf_longseq import load_longseq_hf

    model = tiny(name)
    export_longseq_hf(model, str(tmp_path / "hf"))
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    old = {
        key.replace("transformer.stack.", "transformer.")
        .replace(".rel.r_net.", ".r_net.")
        .replace(".rel.rel_table", ".rel_table"): value
        for key, value in weights.items()
    }
    assert len(old) == len(weights) and not any(".stack." in key for key in old)
    save_file(old, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    x = torch.randint(0, 50, (2, 5))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert torch.equal(hf(x).logits, model(x).logits)
    assert torch.equal(load_longseq_hf(str(tmp_path / "hf"))[0](x).logits, model(x).logits)
    hf.save_pretrained(str(tmp_path / "again"))
    assert set(load_file(str(tmp_path / "again" / "model.safetensors"))) == set(weights)


def test_generate_without_cache_or_continuing_one_draws_the_same_tokens():
    model = tiny("mixers-shaw")
    hf = longseq.hf.from_longseq(model, segment_len=SEGMENT, generate_mem_len=9)
    x = torch.randint(0, 50, (2, 7))
    expected = generate(model, x, 8, temperature=0, recurrence=model.config.recurrence(mem_len=9), segment_len=SEGMENT)
    recomputed = hf.generate(x, max_new_tokens=8, do_sample=False, use_cache=False)  # the prompt read again per token
    first = hf.generate(x, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    continued = hf.generate(first.sequences, cache=first.cache, max_new_tokens=5, do_sample=False)
    assert torch.equal(recomputed[:, 7:], expected) and torch.equal(continued[:, 7:], expected)
    one = x[:, :1]  # a one-token prompt: nothing to read before it, the memory is still longseq's ring
    assert torch.equal(
        hf.generate(one, max_new_tokens=5, do_sample=False)[:, 1:],
        generate(model, one, 5, temperature=0, recurrence=model.config.recurrence(mem_len=9), segment_len=SEGMENT),
    )
    with pytest.raises(ValueError, match="the cache has read 7 tokens"):
        hf.generate(x, cache=hf(x).cache, max_new_tokens=2)


def test_training_through_transformers_gives_longseqs_gradients():
    model = tiny("compressed-tokens-int8").train()
    hf = longseq.hf.from_longseq(model).train()
    x = torch.randint(0, 50, (2, 9))
    hf(x, labels=x).loss.backward()
    out = model(x, labels=torch.cat([x[:, 1:], torch.full((2, 1), -100)], dim=1))
    (out.loss + out.aux_loss if out.aux_loss is not None else out.loss).backward()
    ours = dict(model.named_parameters())
    for name, param in hf.model.named_parameters():
        assert torch.allclose(param.grad, ours[name].grad, atol=1e-6, rtol=1e-5), name


def test_nan_weights_are_refused_by_from_pretrained_and_convert(tmp_path, capsys):
    """from_pretrained loaded NaN or Inf weights without a word (greedy generation then emitted token 0 forever),
    and convert --from-hf wrote a checkpoint of them that eval then refused."""
    model = tiny("window-dilated")
    with torch.no_grad():
        model.transformer.stack.layers[1].pos_ff.core_net[0].weight[0, 0] = float("nan")
        next(model.crit.parameters())[0, 0] = float("inf")
    export_longseq_hf(model, str(tmp_path / "hf"))
    with pytest.raises(ValueError, match=r"NaN or Inf weights in 2 tensor\(s\)"):
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    out = tmp_path / "back"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "NaN or Inf" in err and "model.safetensors" in err and "Traceback" not in err and not out.exists()


def test_convert_from_hf_names_a_broken_directory_without_a_traceback(tmp_path, capsys):
    """A config.json without its longseq section, a truncated model.safetensors and a tensor of the wrong shape were
    raw tracebacks (KeyError-free defaults, SafetensorError, a size-mismatch RuntimeError)."""
    export_longseq_hf(tiny("window-dilated"), str(tmp_path / "good"))
    weights_path, config_path = "model.safetensors", "config.json"

    def broken(name, change) -> str:
        directory = tmp_path / name
        directory.mkdir()
        for file in os.listdir(tmp_path / "good"):
            (directory / file).write_bytes((tmp_path / "good" / file).read_bytes())
        change(directory)
        return str(directory)

    def no_section(d):
        config = json.loads((d / config_path).read_text())
        del config["longseq"]
        (d / config_path).write_text(json.dumps(config))

    def truncated(d):
        data = (d / weights_path).read_bytes()
        (d / weights_path).write_bytes(data[: len(data) // 2])

    def reshaped(d):
        weights = load_file(str(d / weights_path))
        name = "model.transformer.stack.layers.0.pos_ff.core_net.0.weight"
        weights[name] = torch.zeros(weights[name].shape[0] + 1, weights[name].shape[1])
        save_file(weights, str(d / weights_path))

    for name, change, words in (("section", no_section, ("config.json", "no longseq section")),
                                ("truncated", truncated, ("model.safetensors", "truncated")),
                                ("shape", reshaped, ("model.safetensors", "core_net.0.weight"))):  # fmt: skip
        source = broken(name, change)
        assert main(["convert", "--from-hf", source, "--out", str(tmp_path / f"{name}-out")]) == 2, name
        err = capsys.readouterr().err
        assert all(word in err for word in words) and "Traceback" not in err, err
        assert not (tmp_path / f"{name}-out").exists()


def test_an_integer_tensor_where_a_float_weight_belongs_is_refused_by_name(tmp_path, capsys):
    """An int64 tensor in place of a float weight was cast silently by from_pretrained and by convert --from-hf (the
    model then computed with whole numbers); both name the tensor, its dtype and the file."""
    export_longseq_hf(tiny("window-dilated"), str(tmp_path / "hf"))
    path = tmp_path / "hf" / "model.safetensors"
    weights = load_file(str(path))
    name = "model.transformer.stack.layers.0.pos_ff.core_net.0.weight"
    weights[name] = (weights[name] * 100).long()
    save_file(weights, str(path), metadata={"exported_by": "longseq convert"})
    with pytest.raises(ValueError) as caught:
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert all(word in str(caught.value) for word in (f"{name} (I64)", str(path), "cast")), caught.value
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 2
    err = capsys.readouterr().err
    assert f"{name} (torch.int64)" in err and str(path) in err and "Traceback" not in err
    assert not (tmp_path / "back").exists()


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("vocab_size", 65, ["vocab_size=65", "longseq.vocab_size=50", "fix vocab_size"]),
        ("segment_len", "abc", ["segment_len", "'abc'", "whole number"]),
        ("generate_mem_len", -3, ["generate_mem_len", "-3"]),
    ],
)
def test_a_bad_config_json_key_is_named_with_the_file_to_fix(key, value, words, tmp_path, capsys):
    """from_pretrained said "config vocab_size=65 disagrees with the longseq model config, which has 256" without
    the file, and ``"segment_len": "abc"`` was a TypeError there and "invalid literal for int()" in convert: each
    names the key, the value and the config.json, through AutoModelForCausalLM, the class and convert --from-hf."""
    export_longseq_hf(tiny("window-dilated"), str(tmp_path / "hf"))
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, key: value}))
    for load in (AutoModelForCausalLM.from_pretrained, LongseqForCausalLM.from_pretrained, AutoConfig.from_pretrained):
        with pytest.raises(ValueError) as caught:
            load(str(tmp_path / "hf"))
        assert all(word in str(caught.value) for word in [str(path), *words]), caught.value
    if key != "vocab_size":  # convert reads the longseq section's vocabulary, which the weights have
        assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 2
        err = capsys.readouterr().err
        assert all(word in err for word in [str(path), *words]) and "Traceback" not in err, err


def test_a_to_hf_from_hf_round_trip_keeps_the_run_or_says_what_it_did_not_carry(tmp_path, capsys):
    """A to-hf -> from-hf round trip gave back the model with longseq's default eval_batch_size, eval_max_segments
    and training recipe, without a note (3.60759 against 3.60791 on a re-evaluation).  The export carries the run's
    data and train sections, through save_pretrained too, and convert gives them back equal; a directory without
    them (an older export, a TransfoXL one) is converted with the defaults, and the checkpoint, stderr and the
    result say what was not carried."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**BASE, **CONFIGS["window-dilated"], "vocab_size": 256})).eval()
    data = DataConfig(tokenizer="byte", tgt_len=5, eval_tgt_len=7, batch_size=6, eval_batch_size=3)
    run = RunConfig(model.config, data, TrainConfig(max_steps=77, lr=2e-3, eval_max_segments=9, seed=5))
    save_checkpoint(str(tmp_path / "ck"), model, run, ByteTokenizer())
    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]) == 0
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).save_pretrained(str(tmp_path / "saved"))
    for directory in ("hf", "saved"):
        back = tmp_path / f"{directory}-back"
        assert main(["convert", "--from-hf", str(tmp_path / directory), "--out", str(back), "--json"]) == 0
        assert "not_carried" not in json.loads(capsys.readouterr().out.splitlines()[-1])
        _, _, back_run, metrics = load_checkpoint(str(back))
        assert back_run == run and "not_carried" not in metrics
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["longseq_run"]  # an export written before the run travelled with it
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "old"), "--json"]) == 0
    captured = capsys.readouterr()
    _, _, old_run, metrics = load_checkpoint(str(tmp_path / "old"))
    assert old_run.data.eval_batch_size != 3 and old_run.train.eval_max_segments != 9  # the defaults ...
    for said in (metrics["not_carried"], json.loads(captured.out.splitlines()[-1])["not_carried"], captured.err):
        assert all(word in said for word in ("eval_batch_size", "eval_max_segments", "recipe", "longseq_run"))
