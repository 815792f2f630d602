"""``smiles``: molecules one a line, cut by the regular expression of Schwaller et al. (Molecular Transformer, 2019).

Bracket atoms (``[nH]``, ``[C@@H]``, ``[O-]``), the two-letter organic atoms ``Cl`` and ``Br``, and ring-bond numbers
(``1``, ``%12``) are single tokens; so are bonds, branches and aromatic atoms.  The line end is a token too: it
ends a molecule and starts the next, so a molecule is a line (``line_records``: with ``doc_reset`` every molecule is
read alone), and unprompted generation starts from it.  The vocabulary is the tokens of the training text, ordered
by their frequency there (ties by the token); a token outside it, or a character the expression does not cut
(a space, a letter that is no atom), is refused by name at its line and column.  Decoding joins the tokens, so
every SMILES comes back exactly.  SELFIES strings (``[C][=O]``) are read by the same expression: each symbol is a
bracket token.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from longseq.data.tokenizers.base import Settings, Tokenizer, TokenizerError, UnknownCharacterError, whole_lines

SMILES_REGEX = r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>|\*|\$|\%[0-9]{2}|[0-9])"
PATTERN = re.compile(r"(?:" + SMILES_REGEX[1:-1] + r"|\n)")  # the expression's alternatives, and the line end
MISSING = "<not in the SMILES vocabulary>"


def smiles_tokens(text: str) -> list[str]:
    """The tokens of ``text`` (SMILES lines); a character that no token covers is an error at its line and column."""
    tokens = PATTERN.findall(text)
    if sum(map(len, tokens)) != len(text):
        position = 0
        for match in PATTERN.finditer(text):
            if match.start() != position:
                break
            position = match.end()
        raise _error(text, position, text[position], "is not part of any SMILES token")
    return tokens


def _error(text: str, index: int, token: str, why: str) -> UnknownCharacterError:
    line = text.count("\n", 0, index) + 1
    return UnknownCharacterError(token[0], index, line, index - text.rfind("\n", 0, index), 0, token, why)


class SmilesTokenizer(Tokenizer):
    kind = "smiles"
    fit_on = "train"
    line_records = True
    start_text = "\n"

    def __init__(self, tokens: list[str]) -> None:
        if "\n" not in tokens:
            tokens = ["\n", *tokens]
        self.tokens = list(tokens)
        self.index = {token: i for i, token in enumerate(self.tokens)}
        if len(self.index) != len(self.tokens):
            raise TokenizerError("the SMILES vocabulary has duplicates")

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> SmilesTokenizer:
        counts: Counter[str] = Counter()
        for block in whole_lines(blocks):
            counts.update(smiles_tokens(block))
        return cls(sorted(counts, key=lambda token: (-counts[token], token)))

    @classmethod
    def from_dict(cls, data: dict) -> SmilesTokenizer:
        return cls(data["tokens"])

    def to_dict(self) -> dict:
        return {"kind": self.kind, "tokens": self.tokens}

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def pieces(self, blocks: Iterable[str]) -> Iterator[str]:
        return whole_lines(blocks)  # a token never crosses a line end; a block may end inside "Cl"

    def encode(self, text: str) -> np.ndarray:
        tokens = smiles_tokens(text)
        try:
            return np.fromiter((self.index[token] for token in tokens), dtype=np.int64, count=len(tokens))
        except KeyError as exc:
            unknown = exc.args[0]
            position = sum(len(t) for t in tokens[: tokens.index(unknown)])
            raise _error(text, position, unknown, f"is not in the {self.vocab_size}-token SMILES vocabulary") from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.tokens[int(i)] for i in ids)

    def offsets(self, text: str) -> np.ndarray:
        spans = [match.span() for match in PATTERN.finditer(text)]
        return np.asarray(spans, dtype=np.int64).reshape(-1, 2)

    def byte_lengths(self) -> np.ndarray:
        return np.asarray([len(token.encode("utf-8")) for token in self.tokens], dtype=np.int64)

    def to_hf(self) -> HFTokenizer:
        """The same expression as a ``Split`` pre-tokenizer over a ``WordLevel`` model of the vocabulary, no unknown
        token (a token outside it is an error at encoding, as here)."""
        hf = HFTokenizer(models.WordLevel(dict(self.index), unk_token=MISSING))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(SMILES_REGEX + r"|\n"), behavior="isolated")
        hf.decoder = decoders.Fuse()
        return hf
