"""Hugging Face TransfoXL (transformers 4.46.3) <-> longseq: exact conversion in both directions.

TransfoXL was deleted in transformers 5, so these tests are marked ``legacy_hf`` and skipped unless transformers 4.x
is installed; CI (transformers 5) holds the import path to a committed reference instead
(tests/test_transfo_xl_fixture.py).  Run them in an environment with transformers 4.46.3 (docs/transformers.md):

    python -m venv --system-site-packages /tmp/legacy && /tmp/legacy/bin/pip install "transformers==4.46.3" "tokenizers<0.21"
    /tmp/legacy/bin/python -m pytest tests/test_interop.py

transformers 4.46.3 fails on current torch at ``pos_seq.type_as(dtype=...)``; the package's
:mod:`longseq.interop.transfo_xl_compat` fixes that, and these tests use it.
"""

import json
import os
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) >= 5:
    pytest.skip(
        f"legacy_hf: HF TransfoXL needs transformers 4.x, this is {transformers.__version__} (see the module docstring)",
        allow_module_level=True,
    )
pytestmark = pytest.mark.legacy_hf
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

from support import raises_naming  # noqa: E402
from transformers import TransfoXLConfig, TransfoXLLMHeadModel  # noqa: E402

from longseq import TransformerXLLM  # noqa: E402
from longseq.cli import main  # noqa: E402
from longseq.interop.transfo_xl import ConversionError, convert_from_hf, export_to_hf, load_hf  # noqa: E402
from longseq.interop.transfo_xl_compat import apply as apply_compat  # noqa: E402
from longseq.train import load_checkpoint  # noqa: E402

apply_compat()  # Tensor.type_as(dtype=...) inside HF's TransfoXLModel.forward, as users of the old format do


@pytest.fixture(autouse=True)
def float64_reference(monkeypatch):
    """HF's attention masks scores through ``.float()`` and ``finfo(dtype).min``; in float64 that overflows.
    While HF's attention runs, ``.float()`` leaves float64 tensors alone, so the reference stays float64 (a test
    shim only: users run HF's TransfoXL in float32)."""
    original_float = torch.Tensor.float
    attention = transformers.models.deprecated.transfo_xl.modeling_transfo_xl.RelPartialLearnableMultiHeadAttn
    original_forward = attention.forward

    def forward(self, *args, **kwargs):
        torch.Tensor.float = lambda t, *a, **k: t if t.dtype == torch.float64 else original_float(t, *a, **k)
        try:
            return original_forward(self, *args, **kwargs)
        finally:
            torch.Tensor.float = original_float

    monkeypatch.setattr(attention, "forward", forward)


BASE = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.1, dropatt=0.1, mem_len=6)
CONFIGS = {
    "div1-untied-r": dict(
        BASE, vocab_size=50, cutoffs=[10, 30], div_val=1, d_embed=16, untie_r=True, same_length=False, clamp_len=-1
    ),
    "div4-shared-r-same-length-clamp": dict(
        BASE, vocab_size=70, cutoffs=[10, 20, 40], div_val=4, d_embed=64, untie_r=False, same_length=True, clamp_len=4
    ),
    "div1-projected-prelnorm": dict(
        BASE, vocab_size=40, cutoffs=[15], div_val=1, d_embed=8, pre_lnorm=True, untie_r=True, same_length=True
    ),
    "plain-softmax": dict(BASE, vocab_size=30, cutoffs=[], div_val=1, d_embed=16, untie_r=False, clamp_len=3),
}


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**CONFIGS[name]))
    for param in model.parameters():  # HF's init leaves u/v and some biases at zero: randomise everything
        torch.nn.init.normal_(param, 0.0, 0.3)
    return model.eval()


def save_hf(model, directory, safe=True):
    # HF itself cannot write shared u/v (untie_r=False) to safetensors: such checkpoints exist only as .bin
    model.save_pretrained(directory, safe_serialization=safe and model.config.untie_r)
    return directory


def run_both(hf, ours, dtype, segments=3, batch=3, qlen=5):
    hf, ours = hf.to(dtype), ours.to(dtype)
    cfg = ours.config
    # HF computes the inv_freq constant of R once, in float32; a float64 reference computes it in float64
    steps = torch.arange(0.0, cfg.d_model, 2.0, dtype=torch.float64)
    hf.transformer.pos_emb.inv_freq = (1 / (10000 ** (steps / cfg.d_model))).to(dtype)
    x = torch.randint(0, cfg.vocab_size, (batch, segments * qlen + 1))
    hf_mems = [torch.zeros(0, batch, cfg.d_model, dtype=dtype) for _ in range(cfg.n_layer)]  # empty, as the paper
    our_mems = None
    for s in range(segments):
        inp = x[:, s * qlen : (s + 1) * qlen]
        hf_out = hf(inp, mems=hf_mems)
        our_out = ours(inp, our_mems)
        ours_lp = our_out.logits if cfg.cutoffs else torch.log_softmax(our_out.logits, -1)
        yield "log-probs", hf_out.prediction_scores, ours_lp
        for hm, om in zip(hf_out.mems, our_out.mems):
            yield "mems", hm.transpose(0, 1), om
        labels = torch.cat([inp[:, 1:], torch.full((batch, 1), -100)], dim=1)  # HF shifts inside, we align
        yield "loss", hf(inp, mems=hf_mems, labels=inp).loss, ours(inp, our_mems, labels).loss
        hf_mems, our_mems = hf_out.mems, our_out.mems


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_converted_model_matches_hf(name, dtype, tol, tmp_path):
    hf = hf_model(name)
    ours = load_hf(save_hf(hf, str(tmp_path / "hf")))
    checked = 0
    for what, expected, actual in run_both(hf, ours, dtype):
        assert expected.shape == actual.shape, what
        assert torch.allclose(expected, actual, atol=tol, rtol=0), (what, (expected - actual).abs().max())
        checked += 1
    assert checked == 3 * (2 + ours.config.n_layer)


def test_hf_default_zero_memory_is_reproducible(tmp_path):
    """HF starts from mem_len zero vectors when mems=None; passing the same zeros to longseq agrees."""
    hf = hf_model("div1-untied-r")
    ours = load_hf(save_hf(hf, str(tmp_path / "hf")))
    x = torch.randint(0, 50, (2, 5))
    zeros = tuple(torch.zeros(2, ours.config.memory.mem_len, 16) for _ in range(2))
    assert torch.allclose(hf(x).prediction_scores, ours(x, zeros).logits, atol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_round_trip_hf_longseq_hf_is_identical(name, tmp_path):
    hf = hf_model(name)
    ours = load_hf(save_hf(hf, str(tmp_path / "hf"), safe=False))  # pytorch_model.bin, read with weights_only
    export_to_hf(ours, str(tmp_path / "back"))
    again = TransfoXLLMHeadModel.from_pretrained(str(tmp_path / "back")).eval()
    original = hf.state_dict()
    for key, value in again.state_dict().items():
        assert torch.equal(value, original[key]), key
    assert set(again.state_dict()) == set(original)
    x = torch.randint(0, ours.config.vocab_size, (2, 6))
    assert torch.allclose(
        again(x).prediction_scores, hf(x).prediction_scores, atol=1e-5, rtol=0
    )  # same tensors; float32 rounding


def test_convert_cli_with_plain_text_vocab(tmp_path, capsys):
    hf = hf_model("div1-untied-r")
    hf_dir = save_hf(hf, str(tmp_path / "hf"))
    words = ["<eos>", "<unk>", "the"] + [f"w{i}" for i in range(47)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    out = str(tmp_path / "ls")
    assert main(["convert", "--from-hf", hf_dir, "--out", out, "--vocab", str(tmp_path / "vocab.txt"), "--json"]) == 0
    model, tokenizer, run, _ = load_checkpoint(out)
    assert tokenizer.words == words and run.model.memory.mem_len == 6 and run.model.untie_r
    assert main(["generate", "--checkpoint", out, "--prompt", "the w3 w7", "--max-new-tokens", "4", "--json"]) == 0
    text = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    assert len(text.split()) >= 1
    to_hf = ["convert", "--to-hf", "--format", "transfo-xl", "--checkpoint", out, "--out", str(tmp_path / "hf2")]
    assert main(to_hf) == 0
    assert (tmp_path / "hf2" / "vocab.txt").read_text().split("\n")[:3] == ["<eos>", "<unk>", "the"]
    assert isinstance(load_hf(str(tmp_path / "hf2")), TransformerXLLM)


def test_conversion_errors_are_clear(tmp_path):
    hf_dir = save_hf(hf_model("div1-untied-r"), str(tmp_path / "hf"))
    with pytest.raises(ConversionError, match="pass --vocab"):
        convert_from_hf(hf_dir)
    (tmp_path / "bad_vocab.txt").write_text("a\nb\n")
    with pytest.raises(ConversionError, match="lacks <eos>"):
        convert_from_hf(hf_dir, vocab=str(tmp_path / "bad_vocab.txt"))

    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ConversionError, match="not a TransfoXL checkpoint"):
        load_hf(str(other))
    with pytest.raises(ConversionError, match="no config.json"):
        load_hf(str(tmp_path))

    config_path = os.path.join(hf_dir, "config.json")
    config = json.loads(open(config_path).read())
    for key, value, message in [("attn_type", 1, "attn_type=1"), ("sample_softmax", 5, "sample_softmax=5")]:
        open(config_path, "w").write(json.dumps({**config, key: value}))
        with pytest.raises(ConversionError, match=message):
            load_hf(hf_dir)
    open(config_path, "w").write(json.dumps({**config, "d_inner": 48}))
    with raises_naming(ConversionError, "transformer.stack.layers.0.pos_ff.core_net.0.", "(32", "(48"):
        load_hf(hf_dir)


def test_longseq_hf_says_it_needs_transformers_5():
    with pytest.raises(ImportError, match=r"longseq.hf needs transformers 5, this is 4\."):
        import longseq.hf  # noqa: F401
