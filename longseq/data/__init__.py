"""Tokenizers, corpus readers and ordered LM batching."""

from longseq.data.batching import BatchingError, OrderedStream, Segment
from longseq.data.corpus import Corpus, CorpusError, load_corpus, unigram_bits_per_token
from longseq.data.tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    TokenizerError,
    WordTokenizer,
    build_tokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)

__all__ = [
    "BatchingError",
    "ByteTokenizer",
    "CharTokenizer",
    "Corpus",
    "CorpusError",
    "OrderedStream",
    "Segment",
    "Tokenizer",
    "TokenizerError",
    "WordTokenizer",
    "build_tokenizer",
    "load_corpus",
    "load_tokenizer",
    "tokenizer_from_dict",
    "unigram_bits_per_token",
]
