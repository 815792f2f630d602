"""Pretrained Llama-family checkpoints (Llama, Mistral, Qwen2, Qwen3) in and out.

Claims: a tiny random-initialised transformers model of each family, saved and converted, scores as transformers'
own model on the same weights, in float64 to 1e-10 (transformers computing in float64 throughout:
``support.wide_transformers``), with grouped-query attention, tied and untied embeddings, q/k/v and output biases,
the MLP's biases, QK-norm, every rope scaling kind and sliding windows; read in segments with the memory carried it
equals its own full attention inside its context; greedy generation picks the same tokens; ``to-hf`` writes the
family's own layout back, tensor for tensor, and transformers scores it the same; sharded safetensors read as one
file; and whatever longseq lacks is refused by name before a weight is read."""

from __future__ import annotations

import json
import os

import pytest
import torch
from support import in_segments, raises_naming, wide_transformers

from longseq.interop.llama import (
    IGNORED,
    MAPPED,
    ConversionError,
    declared_fields,
    load_llama_folder,
)
from longseq.model import KVMemory, Memory

transformers = pytest.importorskip("transformers")

BASE = dict(
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
YARN = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 16}
CASES = {  # id: (model_type, the config's fields beyond BASE)
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 4}),
    "llama-linear": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}),
    "llama-dynamic": ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}),
    "llama-llama3": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "rope_theta": 500000.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "llama-yarn": ("llama", {"rope_parameters": YARN, "num_key_value_heads": 1}),
    "llama-yarn-mscale": ("llama", {"rope_parameters": {**YARN, "mscale": 2.0, "mscale_all_dim": 1.0}}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
    "qwen2-biases-window": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, "tie_word_embeddings": True},
    ),
    "qwen3-qk-norm": ("qwen3", {"head_dim": 16, "attention_bias": True}),
}


def hf_model(model_type: str, **fields):
    """transformers' float64 model of ``model_type`` (built under :func:`wide_transformers`), its norms and biases
    drawn at random as well (they start at 1 and 0)."""
    config = transformers.AutoConfig.for_model(model_type, **{**BASE, **fields})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.normal_(1.0 if "norm" in name else 0.0, 0.5)
    return model.double().eval()


@pytest.fixture(scope="module", params=list(CASES))
def converted(request, tmp_path_factory):
    """(transformers' model, longseq's float64 model converted from its saved folder, that folder, model type)."""
    model_type, fields = CASES[request.param]
    folder = str(tmp_path_factory.mktemp(request.param))
    with wide_transformers(model_type):
        theirs = hf_model(model_type, **fields)
    theirs.save_pretrained(folder)
    ours, _, _ = load_llama_folder(folder)
    return theirs, ours.double(), folder, model_type


def test_logits_equal_transformers_in_float64(converted):
    theirs, ours, _, model_type = converted
    x = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), wide_transformers(model_type):
        expected = theirs(x).logits
    with torch.no_grad():
        got = ours(x).logits
    assert (got - expected).abs().max() < 1e-10


def test_dynamic_rope_beyond_the_context_equals_one_pass_of_transformers():
    """transformers' dynamic NTK rescales the base for a pass longer than max_position_embeddings: one pass of 100
    tokens over a 64-token context."""
    model_type, fields = CASES["llama-dynamic"]
    with wide_transformers(model_type):
        theirs = hf_model(model_type, **fields)
    state = {k: v for k, v in theirs.state_dict().items()}
    from longseq.interop.llama import build_from_hf, model_config

    config, _ = model_config(theirs.config, "test")
    ours = build_from_hf(config, state, "test").double()
    x = torch.randint(0, 50, (1, 100), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), wide_transformers(model_type):
        expected = theirs(x).logits
    with torch.no_grad():
        got = ours(x).logits
    assert (got - expected).abs().max() < 1e-10


def test_reading_in_segments_equals_full_attention_inside_the_context(converted):
    """The default memory (mem_len = max_position_embeddings - tgt_len) makes a 64-token text read in segments of
    tgt_len, the memory carried (hidden states, or keys and values as evaluation keeps them), the model's own full
    attention over it."""
    _, ours, _, _ = converted
    assert ours.config.memory.mem_len == 32  # and the segment (tgt_len) 32: a context of 64
    x = torch.randint(0, 50, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = ours(x).logits
        hidden, _ = in_segments(ours, x, 32)
        cached, _ = in_segments(ours, x, 32, Memory.empty(KVMemory))
    assert (hidden - whole).abs().max() < 1e-10 and (cached - whole).abs().max() < 1e-10


def test_greedy_generation_picks_transformers_tokens(converted):
    from longseq.generation import generate

    theirs, ours, _, model_type = converted
    prompt = torch.randint(0, 50, (1, 7), generator=torch.Generator().manual_seed(4))
    theirs.generation_config.eos_token_id = None  # longseq's generate has no end-of-text stop
    with torch.no_grad(), wide_transformers(model_type):
        expected = theirs.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    got = generate(ours, prompt, 20, temperature=0.0, segment_len=32)
    assert torch.equal(got, expected[:, 7:])


def test_a_sharded_checkpoint_reads_as_one_file(tmp_path):
    with wide_transformers("llama"):
        theirs = hf_model("llama")
    theirs.save_pretrained(tmp_path / "whole")
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert os.path.isfile(tmp_path / "sharded" / "model.safetensors.index.json")
    whole, _, _ = load_llama_folder(str(tmp_path / "whole"))
    sharded, _, _ = load_llama_folder(str(tmp_path / "sharded"))
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), sharded.state_dict().values()))


def test_every_field_the_families_declare_is_mapped():
    """Every field of transformers' Llama, Mistral, Qwen2 and Qwen3 configs is mapped onto longseq's model or
    changes no logit; a field a newer transformers adds fails here until it is mapped or refused."""
    for model_type in ("llama", "mistral", "qwen2", "qwen3"):
        assert declared_fields(model_type) <= MAPPED | IGNORED, model_type


def write_config(folder, **fields) -> str:
    """A folder with only a config.json (no weights: a refusal must come before any weight is read)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "llama", **BASE, **fields}, f)
    return str(folder)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"model_type": "mixtral", "num_local_experts": 4}, ("mixtral", "mixture of experts")),
        ({"model_type": "gpt2"}, ("gpt2", "not supported")),
        ({"num_experts": 4}, ("num_experts", "mixture of experts")),
        ({"quantization_config": {"quant_method": "gptq"}}, ("quantization_config",)),
        ({"hidden_act": "gelu"}, ("hidden_act", "gelu")),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, ("rope_type", "longrope")),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
            ("partial_rotary_factor",),
        ),
        ({"model_type": "qwen2", "layer_types": ["full_attention", "chunked_attention"]}, ("chunked_attention",)),
    ],
)
def test_what_longseq_lacks_is_refused_by_name_before_any_weight(tmp_path, fields, words):
    with raises_naming(ConversionError, *words):
        load_llama_folder(write_config(tmp_path / "model", **fields))


def test_weights_that_do_not_fit_are_named(tmp_path):
    with wide_transformers("llama"):
        theirs = hf_model("llama")
    theirs.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with raises_naming(ConversionError, "model.layers.2.input_layernorm.weight", "missing"):
        load_llama_folder(str(tmp_path))


def test_to_hf_writes_the_family_back_tensor_for_tensor(converted, tmp_path):
    """The round trip: the export's tensors are the source's, its config maps onto the same longseq model, and
    transformers loads it as the source's class and scores as the source does."""
    from safetensors.torch import load_file

    from longseq.interop.llama import export_llama_hf

    theirs, ours, folder, model_type = converted
    context = ours.config.memory.mem_len + 32
    assert export_llama_hf(ours, str(tmp_path / "out"), context) == model_type
    written, source = (
        load_file(tmp_path / "out" / "model.safetensors"),
        load_file(os.path.join(folder, "model.safetensors")),
    )
    tied = {"lm_head.weight"} if theirs.config.tie_word_embeddings else set()
    assert set(written) == set(source) - tied
    assert all(torch.equal(written[name], source[name]) for name in written)
    again, _, _ = load_llama_folder(str(tmp_path / "out"))
    assert again.config == ours.config
    with wide_transformers(model_type):
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager")
        assert type(back) is type(theirs)
        x = torch.randint(0, 50, (1, 40), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            assert (back.double()(x).logits - theirs(x).logits).abs().max() < 1e-10


@pytest.mark.parametrize(
    "model_type, extra, words",
    [
        ("qwen2", {}, ("qwen2", "qkv_bias=False")),
        ("llama", {"pattern.attention": ["window"]}, ("pattern.attention=window",)),
        ("llama", {"embed_scale": True}, ("embed_scale=True",)),
    ],
)
def test_what_a_family_cannot_hold_is_refused_by_name(tmp_path, model_type, extra, words):
    from dataclasses import replace

    from longseq.config.model import PatternConfig
    from longseq.interop.llama import export_llama_hf, model_config
    from longseq.model import TransformerXLLM

    config, _ = model_config(transformers.AutoConfig.for_model("llama", **BASE), "test")
    if "pattern.attention" in extra:
        config = replace(config, pattern=PatternConfig(attention=extra["pattern.attention"], window=4))
    else:
        config = replace(config, **extra)
    with raises_naming(ConversionError, *words):
        export_llama_hf(TransformerXLLM(config), str(tmp_path / "out"), 64, model_type)
    assert not os.path.exists(tmp_path / "out")


# --- GGUF: a tiny file written here with the gguf package, as llama.cpp's convert_hf_to_gguf.py writes one --------

GGUF_BASE = dict(BASE, vocab_size=300, hidden_size=64, intermediate_size=96, num_attention_heads=4)


def tiny_bpe(vocab_size: int = 300):
    """A byte-level BPE of ``vocab_size`` tokens trained on a little text, its first two tokens special."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    text = ["the cat sat on the mat and the dog sat on the log " * 4, "a quick brown fox jumps over the lazy dog"]
    tokenizer.train_from_iterator(text, trainer)
    return tokenizer


def llama_cpp_permute(weights, n_head: int):
    """llama.cpp's row order of a query or key projection (its rope pairs channels 2k and 2k + 1)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


GGUF_NAMES = {
    "embed_tokens": "token_embd",
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(name: str) -> str:
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    name = name.removeprefix("model.").replace("layers.", "blk.")
    for ours, theirs in GGUF_NAMES.items():
        name = name.replace(ours, theirs)
    return name


def write_gguf(path, model, kinds=None, arch="llama"):
    """``model`` (a float32 LlamaForCausalLM) as a GGUF file: tensors F32, or of ``kinds`` {gguf name: type}."""
    import gguf
    import numpy as np

    c, tokenizer = model.config, tiny_bpe(model.config.vocab_size)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if i < 2 else 1 for i in range(len(vocab))])
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(0)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data = tensor.float().numpy()
        if ".q_proj." in name or ".k_proj." in name:
            heads = c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads
            data = llama_cpp_permute(data, heads)
        kind = (kinds or {}).get(gguf_name(name), gguf.GGMLQuantizationType.F32)
        if kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(data))
        else:
            raw = data.astype(np.int8) if kind == gguf.GGMLQuantizationType.I8 else gguf.quants.quantize(data, kind)
            writer.add_tensor(gguf_name(name), raw, raw_shape=raw.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture(scope="module")
def gguf_llama(tmp_path_factory):
    """(transformers' float32 model, the GGUF file written from it: F32 tensors, the embedding in Q8_0)."""
    gguf = pytest.importorskip("gguf")
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model("llama", **GGUF_BASE, tie_word_embeddings=True)
    ).eval()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return model, write_gguf(path, model, {"token_embd.weight": gguf.GGMLQuantizationType.Q8_0})


def test_a_gguf_file_scores_as_transformers_reads_it(gguf_llama):
    """Read through transformers' GGUF loader (q and k rows unpermuted, Q8_0 dequantized), the model equals the one
    transformers itself loads from the file, in float64 to 1e-10; its unquantized tensors are the source's."""
    from longseq.interop.gguf import load_gguf

    source, path = gguf_llama
    ours, _, _ = load_gguf(path)
    state = ours.state_dict()
    assert torch.equal(
        state["transformer.stack.layers.1.dec_attn.qkv_net.weight"][:64],
        source.state_dict()["model.layers.1.self_attn.q_proj.weight"],
    )
    folder, name = os.path.split(path)
    with wide_transformers("llama"):
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, attn_implementation="eager")
        theirs = theirs.double().eval()
        x = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(6))
        with torch.no_grad():
            expected = theirs(x).logits
    with torch.no_grad():
        assert (ours.double()(x).logits - expected).abs().max() < 1e-10


def test_a_gguf_quantization_the_gguf_package_cannot_read_is_refused_by_name(gguf_llama, tmp_path):
    import gguf

    source, _ = gguf_llama
    path = write_gguf(tmp_path / "i8.gguf", source, {"blk.0.attn_norm.weight": gguf.GGMLQuantizationType.I8})
    with raises_naming(ConversionError, "I8", "blk.0.attn_norm.weight", "dequantize"):
        from longseq.interop.gguf import load_gguf

        load_gguf(path)


def test_a_gguf_architecture_longseq_lacks_is_refused_by_name(gguf_llama, tmp_path):
    from longseq.interop.gguf import load_gguf

    source, _ = gguf_llama
    with raises_naming(ConversionError, "mamba"):
        load_gguf(write_gguf(tmp_path / "mamba.gguf", source, arch="mamba"))


# --- the tokenizer, and the converted checkpoint through the commands ----------------------------------------------

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = "the cat sat on the mat.\n\n  The dog, naïve — sat <|im_start|> on 12345 logs\t\n"


def hf_tokenizer(bos: bool = False):
    """transformers' fast tokenizer over :func:`tiny_bpe`: SmolLM2's special tokens and chat template, and with
    ``bos`` a post-processor that puts ``<|im_start|>`` before every text (as Llama's puts its BOS)."""
    from tokenizers import processors

    backend = tiny_bpe()
    if bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)]
        )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|endoftext|>", chat_template=TEMPLATE
    )


@pytest.mark.parametrize("bos", [False, True])
def test_the_tokenizer_gives_transformers_ids(tmp_path, bos):
    """The ``pretrained`` tokenizer read from a saved folder gives the ids of transformers' tokenizer (without
    special tokens; a prompt with them), decodes as it does, and keeps its special tokens and chat template."""
    from longseq.data.tokenizers import load_tokenizer
    from longseq.interop.llama_tokenizer import read_tokenizer

    theirs = hf_tokenizer(bos)
    theirs.save_pretrained(tmp_path)
    ours = read_tokenizer(str(tmp_path), 310)
    ours.save(str(tmp_path / "longseq.json"))
    ours = load_tokenizer(str(tmp_path / "longseq.json"), vocab_size=310)  # through its saved form
    ids = ours.encode(TEXT)
    assert ids.tolist() == theirs(TEXT, add_special_tokens=False).input_ids
    assert ours.encode_prompt(TEXT).tolist() == ids.tolist()  # a request as written, as the harness's hf model
    assert [*ours.start_ids(), *ids.tolist()] == theirs(TEXT).input_ids  # a prompt of generate
    assert ours.decode(ids) == theirs.decode(ids) == TEXT
    assert ours.text_bytes(ids) == len(TEXT.encode("utf-8"))
    assert (ours.bos_id, ours.eos_id, ours.vocab_size) == (1, 0, 310)
    assert ours.chat_template == TEMPLATE


@pytest.fixture(scope="module")
def pretrained_folder(tmp_path_factory):
    """A tiny Llama saved by transformers (float32) with its tokenizer, and a little corpus in train/valid/test."""
    folder = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("llama", **GGUF_BASE, bos_token_id=1, eos_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder / "hf")
    hf_tokenizer().save_pretrained(folder / "hf")
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text("the cat sat on the mat and the dog sat on the log.\n")
    return folder


@pytest.fixture(scope="module")
def pretrained_checkpoint(pretrained_folder):
    from longseq.cli import main

    out = pretrained_folder / "ckpt"
    assert main(["convert", "--from-hf", str(pretrained_folder / "hf"), "--out", str(out), "--quiet"]) == 0
    return str(out)


def test_eval_of_the_converted_checkpoint_is_transformers_loss(pretrained_folder, pretrained_checkpoint, capsys):
    """``longseq eval`` of the converted checkpoint scores the test text as transformers' model scores the ids its
    tokenizer gives (the text inside the context: full attention)."""
    from support import cli_json

    result = cli_json(["eval", "--checkpoint", pretrained_checkpoint, "--data", str(pretrained_folder), "--split",
                       "test", "--device", "cpu", "--json", "--quiet"], capsys)  # fmt: skip
    theirs = transformers.AutoModelForCausalLM.from_pretrained(pretrained_folder / "hf").eval()
    text = (pretrained_folder / "test.txt").read_text()
    ids = torch.tensor([hf_tokenizer()(text, add_special_tokens=False).input_ids])
    with torch.no_grad():
        loss = theirs(ids, labels=ids).loss.item()
    assert result["loss"] == pytest.approx(loss, abs=1e-5)


def test_generate_is_transformers_greedy_and_chat_uses_the_template(pretrained_folder, pretrained_checkpoint, capsys):
    from support import cli_json

    theirs = transformers.AutoModelForCausalLM.from_pretrained(pretrained_folder / "hf").eval()
    theirs.generation_config.eos_token_id = None
    tokenizer = hf_tokenizer()
    argv = ["generate", "--checkpoint", pretrained_checkpoint, "--max-new-tokens", "12", "--temperature", "0",
            "--device", "cpu", "--json"]  # fmt: skip
    result = cli_json([*argv, "--prompt", "the cat"], capsys)
    prompt = torch.tensor([tokenizer("the cat").input_ids])
    expected = theirs.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, prompt.size(1) :]
    assert result["text"] == tokenizer.decode(expected)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "the dog"}], add_generation_prompt=True)
    chat = chat["input_ids"] if isinstance(chat, dict) or hasattr(chat, "keys") else chat
    chat = torch.tensor([chat])  # which holds the end-of-text token (id 0): no padding mask from it
    expected = theirs.generate(chat, attention_mask=torch.ones_like(chat), max_new_tokens=12, do_sample=False)
    expected = expected[0, chat.size(1) :]
    stop = (expected == 0).nonzero()
    expected = expected[: int(stop[0]) if len(stop) else None]  # the turn ends at the end-of-text token
    from longseq.cli.generate import chat_ids
    from longseq.train.checkpoint import load_checkpoint

    assert chat_ids(load_checkpoint(pretrained_checkpoint)[1], "the dog") == chat[0].tolist()
    assert cli_json([*argv, "--prompt", "the dog", "--chat"], capsys)["tokens"] == len(expected)  # its turn's


def test_to_hf_llama_and_longseq_formats_load_in_transformers(pretrained_folder, pretrained_checkpoint, tmp_path):
    """``--format llama`` writes the family's folder (model and tokenizer) that transformers loads as it loaded the
    source; ``--format longseq`` the longseq transformers format (``import longseq.hf``): the same logits."""
    import longseq.hf  # noqa: F401
    from longseq.cli import main

    source = transformers.AutoModelForCausalLM.from_pretrained(pretrained_folder / "hf").eval()
    x = torch.tensor([hf_tokenizer()(TEXT, add_special_tokens=False).input_ids])
    with torch.no_grad():
        expected = source(x).logits
    for name in ("llama", "longseq"):
        out = tmp_path / name
        argv = ["convert", "--to-hf", "--checkpoint", pretrained_checkpoint, "--out", str(out), "--format", name]
        assert main([*argv, "--quiet"]) == 0
        loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            assert (loaded(x).logits - expected).abs().max() < 1e-5, name
    assert type(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama")) is type(source)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "llama")
    assert tokenizer(TEXT).input_ids == hf_tokenizer()(TEXT).input_ids and tokenizer.chat_template == TEMPLATE


def test_a_full_disk_during_a_llama_export_leaves_no_broken_folder(
    pretrained_checkpoint, tmp_path, capsys, monkeypatch
):
    """``--format llama`` is written as the other formats are (issue 60, item 16): beside ``--out`` and renamed into
    place, so a failed write (an OSError injected into the weights' write) leaves no folder and names ``--out``."""
    import errno

    import safetensors.torch

    from longseq.cli import main

    def full_disk(tensors, path, metadata=None):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    out = tmp_path / "llama"
    argv = ["convert", "--to-hf", "--checkpoint", pretrained_checkpoint, "--out", str(out), "--format", "llama"]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "No space left on device" in err and "Traceback" not in err
    assert not out.exists() and not [name for name in os.listdir(tmp_path) if name.startswith(".llama.")]


def test_the_converted_checkpoint_fine_tunes_and_diagnoses(pretrained_folder, pretrained_checkpoint, tmp_path):
    """An imported model is an ordinary checkpoint: ``finetune`` (classification) and ``diagnose`` run on it."""
    from longseq.cli import main

    rows = [{"text": f"the {w} sat on the mat", "label": w} for w in ("cat", "dog") * 4]
    data = tmp_path / "classify.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["finetune", "--task", "classify", "--data", str(data), "--checkpoint", pretrained_checkpoint,
                 "--segment-len", "8", "--batch-size", "4", "--steps", "2", "--out", str(tmp_path / "ft"),
                 "--quiet"]) == 0  # fmt: skip
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text((pretrained_folder / "test.txt").read_text() * 12)
    assert main(["diagnose", "--checkpoint", pretrained_checkpoint, "--data", str(tmp_path), "--out",
                 str(tmp_path / "report"), "--max-segments", "2", "--contexts", "0,8", "--quiet"]) == 0  # fmt: skip
    assert os.path.isfile(tmp_path / "report" / "report.json")


def test_lm_eval_reads_a_document_after_the_models_own_beginning_of_text(pretrained_folder, pretrained_checkpoint):
    """The harness's rolling log-likelihood of a document is transformers' log-likelihood of its tokens after
    the tokenizer's BOS (what the harness's ``hf`` model puts first)."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from longseq.integrations.harness import LongseqLM

    lm = LongseqLM(pretrained_checkpoint, device="cpu")
    document = "the dog sat on the mat."
    (score,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (document,), 0)], disable_tqdm=True)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(pretrained_folder / "hf").eval()
    ids = torch.tensor([[1, *hf_tokenizer()(document, add_special_tokens=False).input_ids]])
    with torch.no_grad():
        expected = -theirs(ids, labels=ids).loss.item() * (ids.size(1) - 1)
    assert score == pytest.approx(expected, abs=1e-4)
