"""``longseq convert``'s one entry for every source and the Llama-family export with its tokenizer.

:func:`convert_source` chooses the reader by the source: a ``.gguf`` file (:mod:`longseq.interop.gguf`), or a folder
by its ``config.json``'s ``model_type``: ``longseq`` (:mod:`longseq.interop.hf_longseq`), ``transfo-xl``
(:mod:`longseq.interop.transfo_xl`), anything else a Llama-family model (:mod:`longseq.interop.llama`, which
names what it refuses).  :func:`export_family` writes a model in its family's transformers layout with its
tokenizer (``tokenizer.json``, ``tokenizer_config.json``) and ``generation_config.json``.
"""

from __future__ import annotations

import json
import os

from longseq.config import DataConfig, RunConfig, TrainConfig
from longseq.data.tokenizers import Tokenizer
from longseq.data.tokenizers.pretrained import PretrainedTokenizer
from longseq.interop.gguf import load_gguf
from longseq.interop.hf_longseq import convert_from_longseq_hf, is_longseq_hf, run_not_carried
from longseq.interop.hf_tokenizer import save_hf_tokenizer
from longseq.interop.llama import export_llama_hf, family_of, load_llama_folder, read_config_file
from longseq.interop.llama_tokenizer import read_tokenizer
from longseq.interop.transfo_xl import ConversionError, convert_from_hf
from longseq.model import TransformerXLLM

FAMILY_FORMATS = ("llama", "mistral", "qwen2", "qwen3")  # convert --to-hf --format: the family's own layout


def is_transfo_xl(folder: str) -> bool:
    """Whether ``folder``'s config.json is a TransfoXL one (``model_type`` or ``architectures``)."""
    config = read_config_file(folder)
    return config.get("model_type") == "transfo-xl" or any("TransfoXL" in a for a in config.get("architectures") or [])


def convert_source(source: str, vocab: str | None = None) -> tuple[TransformerXLLM, Tokenizer, RunConfig, dict]:
    """The longseq model, tokenizer and run config of ``source`` (a folder or a ``.gguf`` file), and what to
    record of where it came from (the checkpoint's metrics: ``converted_from``, a pretrained model's
    ``model_type``, and ``not_carried``: what of a longseq or TransfoXL model's trained run the folder did not hold,
    :func:`~longseq.interop.hf_longseq.run_not_carried`)."""
    origin = {"converted_from": os.path.abspath(source)}
    if not source.endswith(".gguf"):
        if not os.path.isdir(source):
            raise ConversionError(f"{source} is neither a folder (config.json + weights) nor a .gguf file")
        lost = run_not_carried(source) if is_longseq_hf(source) or is_transfo_xl(source) else None
        said = {**origin, **({"not_carried": lost} if lost else {})}  # what of the trained run is not carried
        if is_longseq_hf(source):
            return (*convert_from_longseq_hf(source, vocab=vocab), said)
        if is_transfo_xl(source):
            return (*convert_from_hf(source, vocab=vocab), said)
    if vocab is not None:
        raise ConversionError(f"{source} brings its own tokenizer: --vocab is for TransfoXL and longseq folders")
    model, tgt_len, hf = load_gguf(source) if source.endswith(".gguf") else load_llama_folder(source)
    tokenizer = read_tokenizer(source, model.config.vocab_size)
    data = DataConfig(
        tokenizer=tokenizer.kind, tgt_len=tgt_len, eval_tgt_len=tgt_len, batch_size=1, eval_batch_size=1
    )  # one stream: a pretrained model's memory is its whole context
    run = RunConfig(model=model.config, data=data, train=TrainConfig())
    return model, tokenizer, run, {**origin, "model_type": hf["model_type"]}


def family_for(format_name: str, model: TransformerXLLM, metrics: dict) -> str:
    """The model type ``--format`` writes: ``mistral``, ``qwen2`` and ``qwen3`` their own; ``llama`` the family's
    layout under the type the model was imported from (``metrics``), or the one its layers fit
    (:func:`~longseq.interop.llama.family_of`)."""
    if format_name != "llama":
        return format_name
    imported = metrics.get("model_type") if isinstance(metrics, dict) else None
    return imported if imported in FAMILY_FORMATS else family_of(model.config)


def export_family(model: TransformerXLLM, out: str, tokenizer: Tokenizer | None, context: int, model_type: str) -> str:
    """``model`` in ``model_type``'s transformers layout in ``out`` (``config.json`` with the tokenizer's special
    ids, ``model.safetensors``, ``generation_config.json``) and its tokenizer; ``context``: its
    ``max_position_embeddings``.  Returns the model type written."""
    written = export_llama_hf(model, out, context, model_type)
    ids = special_ids(tokenizer)
    path = os.path.join(out, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**config, **ids}, f, indent=2, sort_keys=True)
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(ids, f, indent=2, sort_keys=True)
    if isinstance(tokenizer, PretrainedTokenizer):
        save_pretrained_tokenizer(tokenizer, out)
    elif tokenizer is not None:
        save_hf_tokenizer(tokenizer, out)
    return written


def special_ids(tokenizer: Tokenizer | None) -> dict:
    """``bos_token_id``, ``eos_token_id`` and ``pad_token_id`` of a pretrained tokenizer (those it has)."""
    if not isinstance(tokenizer, PretrainedTokenizer):
        return {}
    names = {"bos_token_id": "bos_token", "eos_token_id": "eos_token", "pad_token_id": "pad_token"}
    return {key: tokenizer.token_id(name) for key, name in names.items() if tokenizer.token_id(name) is not None}


def save_pretrained_tokenizer(tokenizer: PretrainedTokenizer, out: str) -> None:
    """``tokenizer.json`` (the tokenizer's own file) and ``tokenizer_config.json`` (its special tokens and chat
    template), which transformers' ``AutoTokenizer`` loads as the same tokenizer."""
    tokenizer.to_hf().save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        **tokenizer.special_tokens(),
        **({"chat_template": tokenizer.chat_template} if tokenizer.chat_template else {}),
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True, ensure_ascii=False)
