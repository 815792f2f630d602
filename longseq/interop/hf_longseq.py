"""longseq models in the transformers format (``model_type: "longseq"``), written and read without transformers.

A directory holds ``config.json`` (the transformers config: ``model_type``, ``architectures``, the longseq
:class:`~longseq.config.ModelConfig` under ``"longseq"``, and how to sample: ``segment_len``, ``generate_mem_len``),
``model.safetensors`` (the language model's tensors under ``model.``, each tied tensor once, under its first name, as
transformers' ``save_pretrained`` writes them), ``generation_config.json`` (sampling as ``longseq generate``: no
top-k, no nucleus, no end-of-text stop) and, given a tokenizer, ``longseq_tokenizer.json`` (longseq's tokenizer, read
by :func:`longseq.data.tokenizers.load_tokenizer`) with ``tokenizer.json`` and ``tokenizer_config.json``, the same
tokenizer as transformers' ``AutoTokenizer`` loads it (:mod:`longseq.interop.hf_tokenizer`).  The padding id is
``vocab_size``, the first id after the vocabulary (``generation_config.json`` names it ``pad_token_id``; the
tokenizer's padding token has it).  ``import longseq.hf`` registers the classes that load it with
``AutoModelForCausalLM.from_pretrained``; :func:`load_longseq_hf` reads one back (``longseq convert --from-hf``).
See docs/transformers.md.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from longseq.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.config.stored import stored_model, stored_weights
from longseq.data.tokenizers import ByteTokenizer, Tokenizer, load_tokenizer
from longseq.interop.hf_tokenizer import save_hf_tokenizer
from longseq.interop.transfo_xl import (
    EXPORT_METADATA,
    ConversionError,
    check_export_directory,
    float_weights,
    read_vocab,
    refuse_cast_weights,
    refuse_non_finite,
)
from longseq.model import TransformerXLLM, build_model
from longseq.model.lstm import LSTMLM
from longseq.outputs import write_directory

MODEL_TYPE = "longseq"
ARCHITECTURE = "LongseqForCausalLM"
PREFIX = "model."  # the language model's attribute in LongseqForCausalLM
TOKENIZER_FILE = "longseq_tokenizer.json"
GENERATION_DEFAULTS = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}  # longseq generate's
LOAD_NOTE = (
    'model_type "longseq" is registered with transformers by longseq: pip install "longseq[hf]", then import '
    "longseq.hf before AutoModelForCausalLM.from_pretrained (see README.md)"
)  # config.json's longseq_load: what a transformers user without longseq reads beside the model type
EXPORT_FILES = (
    "README.md",
    "config.json",
    "model.safetensors",
    "generation_config.json",
    TOKENIZER_FILE,
    "tokenizer.json",
    "tokenizer_config.json",
)  # what export_longseq_hf writes (save_tokenizers: both tokenizers)


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """``{target: source}`` for every parameter that is another one (the softmax tied to the embedding, shared
    projections), read from the module itself: the source is the first name a tensor has."""
    first: dict[int, str] = {}
    tied = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[name] = first[id(param)]
        else:
            first[id(param)] = name
    return tied


def sampling_settings(values: dict, source: str) -> tuple[int, int | None]:
    """``segment_len`` (default 128) and ``generate_mem_len`` (default None) of a ``config.json``'s ``values``, each
    checked: a :class:`ConversionError` names the key, the value and ``source`` (the file)."""
    segment_len, mem_len = values.get("segment_len", 128), values.get("generate_mem_len")
    whole = lambda value: isinstance(value, int) and not isinstance(value, bool)  # noqa: E731
    if not whole(segment_len) or segment_len < 1:
        raise ConversionError(
            f"{source}: segment_len must be a whole number >= 1 (the tokens read at once: the training tgt_len), "
            f"got {segment_len!r}"
        )
    if mem_len is not None and (not whole(mem_len) or mem_len < 0):
        raise ConversionError(
            f"{source}: generate_mem_len must be a whole number >= 0, or null for the model's mem_len + segment_len, "
            f"got {mem_len!r}"
        )
    return segment_len, mem_len


def hf_config(
    config: ModelConfig, segment_len: int = 128, generate_mem_len: int | None = None, run: RunConfig | None = None
) -> dict:
    """The ``config.json`` of a longseq model in the transformers format; with the ``run`` that trained it, its data
    and train sections under ``longseq_run`` (read by nothing but ``convert --from-hf``, which restores them)."""
    if segment_len < 1:
        raise ValueError(f"segment_len must be >= 1, got {segment_len}")
    carried = {} if run is None else {"longseq_run": {"data": run.data.to_dict(), "train": run.train.to_dict()}}
    return {
        **carried,
        "model_type": MODEL_TYPE,
        "architectures": [ARCHITECTURE],
        "longseq": config.to_dict(),
        "segment_len": segment_len,
        "generate_mem_len": generate_mem_len,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "tie_word_embeddings": config.tie_weight,
        "longseq_load": LOAD_NOTE,
    }


def model_card(config: ModelConfig) -> str:
    """The export's ``README.md``: what the model is and what to import before transformers loads it (without
    ``import longseq.hf``, transformers does not know ``model_type: "longseq"``)."""
    mixers = ",".join(config.mixer)
    return f"""---
library_name: transformers
tags:
- longseq
---
# A longseq language model

Written by longseq (`longseq convert --to-hf` or `save_pretrained`):
arch={config.arch}, mixer={mixers}, {config.n_layer} layers of width {config.d_model}, vocabulary of
{config.vocab_size}, memory of {config.memory.mem_len} positions.

Its `config.json` says `"model_type": "longseq"`, a model type that longseq registers with transformers. Install
longseq with its transformers extra and import `longseq.hf` first:

```bash
pip install "longseq[hf]"
```

```python
import longseq.hf  # registers model_type "longseq" with AutoConfig and AutoModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("path/to/this/directory")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")  # when the directory holds tokenizer.json
```

Without `import longseq.hf`, transformers stops with "The checkpoint you are trying to load has model type
`longseq` but Transformers does not recognize this architecture": the import is the fix, not a newer transformers.
"""


def export_longseq_hf(
    model: TransformerXLLM | LSTMLM,
    out: str,
    tokenizer: Tokenizer | None = None,
    segment_len: int = 128,
    generate_mem_len: int | None = None,
    run: RunConfig | None = None,
) -> None:
    """Write ``model`` as a transformers directory that ``AutoModelForCausalLM.from_pretrained`` loads after
    ``import longseq.hf``; ``segment_len`` and ``generate_mem_len`` are how ``longseq generate`` samples it (the
    training ``tgt_len``, and ``mem_len + tgt_len``); ``run``, the run that trained it, travels with it (its data
    and train sections: ``convert --from-hf`` gives them back)."""
    if not isinstance(model, (TransformerXLLM, LSTMLM)):
        raise ValueError(
            f"only a language model exports to transformers; this is a {type(model).__name__} (a fine-tuned model)"
        )
    config = hf_config(model.config, segment_len, generate_mem_len, run)
    generation = {**GENERATION_DEFAULTS, "pad_token_id": model.config.vocab_size}  # the padding id
    check_export_directory(out, EXPORT_FILES)  # a new directory, or an earlier export of convert: nothing else
    skip = set(tied_names(model))
    tensors = {
        PREFIX + name: tensor.detach().contiguous().cpu()
        for name, tensor in model.state_dict(keep_vars=False).items()
        if name not in skip
    }

    def write(directory: str) -> None:
        save_file(tensors, os.path.join(directory, "model.safetensors"), metadata=EXPORT_METADATA)
        with open(os.path.join(directory, "README.md"), "w", encoding="utf-8") as f:
            f.write(model_card(model.config))
        for name, data in (("config.json", config), ("generation_config.json", generation)):
            with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2, sort_keys=True)
        if tokenizer is not None:
            save_tokenizers(tokenizer, directory)

    write_directory(out, write, "the export", (SafetensorError,))  # safetensors' own error for a failed write


def save_tokenizers(tokenizer: Tokenizer, out: str) -> None:
    """``longseq_tokenizer.json`` (longseq's), ``tokenizer.json`` and ``tokenizer_config.json`` (transformers')."""
    tokenizer.save(os.path.join(out, TOKENIZER_FILE))
    save_hf_tokenizer(tokenizer, out)


def is_longseq_hf(directory: str) -> bool:
    """Whether ``directory`` holds a longseq model in the transformers format (its config.json says so)."""
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            return json.load(f).get("model_type") == MODEL_TYPE
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def load_longseq_hf(directory: str) -> tuple[TransformerXLLM | LSTMLM, Tokenizer | None, dict]:
    """The model (eval mode), tokenizer (``longseq_tokenizer.json``; None if absent) and config.json of a directory
    written by :func:`export_longseq_hf` or ``save_pretrained``, read without transformers.  What does not fit (no
    ``longseq`` section, a truncated or foreign ``model.safetensors``, a tensor of another shape, NaN weights) is a
    :class:`ConversionError` naming the file."""
    path = os.path.join(directory, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConversionError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE:
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise ConversionError(f"{directory} is not a longseq transformers directory (model_type {kind!r})")
    if not isinstance(config.get("longseq"), dict):
        raise ConversionError(
            f"{path} has no longseq section (the model's ModelConfig, which convert --to-hf and save_pretrained "
            "write): the architecture is unknown"
        )
    sampling_settings(config, path)  # segment_len and generate_mem_len, named with the file
    try:
        model = build_model(ModelConfig.from_dict(stored_model(config["longseq"])))
    except ConfigError as exc:
        raise ConversionError(f"{path}: its longseq section is not a valid model config: {exc}") from None
    weights_path = os.path.join(directory, "model.safetensors")
    try:
        weights = load_file(weights_path)
    except (OSError, SafetensorError) as exc:
        raise ConversionError(f"cannot read {weights_path} (truncated, or not safetensors): {exc}") from None
    refuse_cast_weights({n: str(t.dtype) for n, t in weights.items()}, weights_path, float_weights(model, PREFIX))
    state = stored_weights(config["longseq"], {name.removeprefix(PREFIX): t for name, t in weights.items()})
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape than the config's
        raise ConversionError(f"{weights_path} does not fit {path}: {exc}") from None
    missing = sorted(set(missing) - set(tied_names(model)))
    if missing or unexpected:
        raise ConversionError(
            f"{directory}: the weights do not fit the config: missing {missing}, unexpected {unexpected}"
        )
    refuse_non_finite(model, weights_path)
    path = os.path.join(directory, TOKENIZER_FILE)
    tokenizer = load_tokenizer(path, vocab_size=model.config.vocab_size) if os.path.isfile(path) else None
    return model.eval(), tokenizer, config


def convert_from_longseq_hf(directory: str, vocab: str | None = None):
    """(model, tokenizer, run config) of a longseq transformers directory, for ``longseq convert --from-hf``: the
    tokenizer from ``longseq_tokenizer.json``, else ``vocab`` (one token per line), else bytes for 256 tokens.  The
    run's data and train sections are those the export carries (``longseq_run``: the trained run's evaluation
    settings and recipe); without them (:func:`run_not_carried` says so), longseq's defaults with ``tgt_len`` the
    directory's ``segment_len``."""
    model, tokenizer, config = load_longseq_hf(directory)
    if vocab is not None:
        tokenizer = read_vocab(vocab)
    if tokenizer is None and model.config.vocab_size == 256:
        tokenizer = ByteTokenizer()
    if tokenizer is None or tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"{directory} has no longseq_tokenizer.json for its {model.config.vocab_size} tokens: pass --vocab FILE"
        )
    path = os.path.join(directory, "config.json")
    segment_len, _ = sampling_settings(config, path)  # checked on reading
    sections = config.get("longseq_run")
    if sections is None:
        data = DataConfig(tokenizer=tokenizer.kind, tgt_len=segment_len, eval_tgt_len=segment_len)
        return model, tokenizer, RunConfig(model=model.config, data=data, train=TrainConfig())
    try:
        run = RunConfig.from_dict({"model": model.config.to_dict(), **sections})
    except (ConfigError, TypeError) as exc:
        raise ConversionError(f"{path}: its longseq_run section is not a run's data and train: {exc}") from None
    if vocab is not None and run.data.tokenizer != tokenizer.kind:
        run = RunConfig(run.model, run.data.replace(tokenizer=tokenizer.kind), run.train)
    return model, tokenizer, run


def run_not_carried(directory: str) -> str | None:
    """What a conversion of ``directory`` (an export, or an HF TransfoXL directory) cannot carry of the run that
    trained its model, in words for the converted checkpoint (None: the export carries the run)."""
    if not is_longseq_hf(directory):
        why = "an HF TransfoXL directory holds the model only"
    else:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            if isinstance(json.load(f).get("longseq_run"), dict):
                return None
        why = "its config.json has no longseq_run: written before exports carried the run, or saved without one"
    return (
        f"the trained run's data and train sections ({why}): eval_batch_size, eval_max_segments, batch_size and "
        "the training recipe (lr, schedule, steps, seed, ...) are longseq's defaults here, and tgt_len and "
        "eval_tgt_len the segment length; give the trained values with --set to compare scores"
    )
