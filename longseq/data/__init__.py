"""Tokenizers, corpus readers (in RAM, or prepared and memory-mapped) and ordered LM batching."""

from longseq.data.batching import BatchingError, OrderedStream, Segment
from longseq.data.corpus import load_corpus, load_data, unigram_bits_per_token
from longseq.data.prepared import load_prepared, prepare_corpus
from longseq.data.sources import Corpus, CorpusError, DocumentIds
from longseq.data.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    PretrainedTokenizer,
    Tokenizer,
    TokenizerError,
    WordTokenizer,
    build_tokenizer,
    check_tokenizer_fits,
    load_tokenizer,
    tokenizer_from_dict,
    train_bpe,
)

__all__ = [
    "BPETokenizer",
    "PretrainedTokenizer",
    "BatchingError",
    "ByteTokenizer",
    "CharTokenizer",
    "Corpus",
    "CorpusError",
    "DocumentIds",
    "OrderedStream",
    "Segment",
    "Tokenizer",
    "TokenizerError",
    "WordTokenizer",
    "build_tokenizer",
    "check_tokenizer_fits",
    "load_corpus",
    "load_data",
    "load_prepared",
    "load_tokenizer",
    "prepare_corpus",
    "tokenizer_from_dict",
    "train_bpe",
    "unigram_bits_per_token",
]
