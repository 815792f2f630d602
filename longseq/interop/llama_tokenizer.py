"""The tokenizer of an imported model, read as transformers reads it (``AutoTokenizer``: a folder's
``tokenizer.json`` and ``tokenizer_config.json``, or a GGUF file's vocabulary converted by transformers), kept as
longseq's ``pretrained`` tokenizer (:class:`~longseq.data.tokenizers.pretrained.PretrainedTokenizer`); and its chat
template rendered by transformers for ``longseq generate --chat``."""

from __future__ import annotations

import os

from longseq.data.tokenizers import TokenizerError
from longseq.data.tokenizers.pretrained import SPECIAL_NAMES, PretrainedTokenizer
from longseq.interop.transfo_xl import ConversionError


def read_tokenizer(source: str, vocab_size: int) -> PretrainedTokenizer:
    """The tokenizer of a transformers folder or a ``.gguf`` file, as longseq's ``pretrained`` kind: the
    library's own file (``backend_tokenizer``), the special tokens transformers names, the chat template."""
    from transformers import AutoTokenizer

    folder, gguf = os.path.split(source) if source.endswith(".gguf") else (source, None)
    try:
        tokenizer = (
            AutoTokenizer.from_pretrained(folder, gguf_file=gguf) if gguf else AutoTokenizer.from_pretrained(folder)
        )
        backend = tokenizer.backend_tokenizer
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ConversionError(f"{source}: transformers cannot read its tokenizer (a fast tokenizer): {exc}") from None
    special = {name: str(getattr(tokenizer, name)) for name in SPECIAL_NAMES if getattr(tokenizer, name, None)}
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default")
    try:
        return PretrainedTokenizer(backend.to_str(), vocab_size, special, template)
    except TokenizerError as exc:
        raise ConversionError(f"{source}: its tokenizer does not fit the model: {exc}") from None


def chat_text(tokenizer: PretrainedTokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """``messages`` (``{"role", "content"}`` dicts) as the chat template writes them, rendered by transformers
    (its Jinja environment, filters and special tokens), ready for :meth:`PretrainedTokenizer.encode`."""
    if not tokenizer.chat_template:
        raise ValueError("this tokenizer has no chat template: generate without --chat")
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.to_hf(), chat_template=tokenizer.chat_template, **tokenizer.special_tokens()
    )
    return hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
