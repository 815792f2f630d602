"""Importing HF TransfoXL checkpoints without transformers 4.x: a committed checkpoint written by transformers 4.46.3
(tests/fixtures/make_transfo_xl.py) and the numbers HF's own TransfoXL computed on it.  These run everywhere, CI
(transformers 5, which has no TransfoXL) included; tests/test_interop.py checks more configurations against the live
HF model where transformers 4.x is installed."""

import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from longseq.interop.transfo_xl import export_to_hf, load_hf, read_hf_weights

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "transfo_xl")


def test_imported_transfo_xl_matches_hf_reference():
    ref = load_file(os.path.join(FIXTURE, "reference.safetensors"))
    model = load_hf(FIXTURE)
    x, qlen, mems, checked = ref["input_ids"], 5, None, 0
    for s in range(ref["input_ids"].size(1) // qlen):
        inp = x[:, s * qlen : (s + 1) * qlen]
        out = model(inp, mems)
        assert torch.allclose(out.logits, ref[f"log_probs.{s}"], atol=1e-5, rtol=0), s
        for i, layer in enumerate(out.mems):
            assert torch.allclose(layer, ref[f"mems.{s}.{i}"], atol=1e-5, rtol=0), (s, i)
        labels = torch.cat([inp[:, 1:], torch.full((inp.size(0), 1), -100)], dim=1)  # HF shifted; longseq aligns
        assert torch.allclose(model(inp, mems, labels).loss.reshape(1), ref[f"loss.{s}"], atol=1e-5, rtol=0)
        mems, checked = out.mems, checked + 1
    assert checked == 3


def test_export_gives_back_the_hf_tensors(tmp_path):
    export_to_hf(load_hf(FIXTURE), str(tmp_path))
    original, again = read_hf_weights(FIXTURE), read_hf_weights(str(tmp_path))
    assert set(original) <= set(again)  # HF's safetensors holds each tied tensor once; the export names them all
    for name, tensor in original.items():
        assert torch.equal(again[name], tensor), name


def test_importing_longseq_and_its_hf_conversion_does_not_import_transformers():
    code = "import sys, longseq, longseq.interop, longseq.cli.convert; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_an_integer_tensor_where_a_float_weight_belongs_is_refused_by_name(tmp_path):
    """An int64 tensor in place of a float weight was copied in, cast without a word: the model then computed with
    whole numbers.  Reading the TransfoXL directory names the tensor and its dtype."""
    import shutil

    from safetensors.torch import save_file

    from longseq.interop.transfo_xl import ConversionError

    shutil.copytree(FIXTURE, tmp_path / "hf")
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    name = next(n for n, t in weights.items() if n.endswith("CoreNet.0.weight"))
    weights[name] = weights[name].round().long()
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"))
    try:
        load_hf(str(tmp_path / "hf"))
    except ConversionError as error:
        assert f"{name} (torch.int64)" in str(error)  # the name the file has
        assert str(tmp_path / "hf") in str(error) and "cast" in str(error)
    else:
        raise AssertionError("an int64 weight was loaded")
