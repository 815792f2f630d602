"""The fixed alphabets of biological sequences (``nucleotide``, ``nucleotide_cased``, ``protein``): the same ids
for the same letters whatever the corpus, case folded or kept as the kind says, ``[MASK]`` read back from text, the
separator its own id, token classes that cover the vocabulary once, the complement an involution that pairs A with
T and C with G, a letter outside the alphabet named with its place and the alphabet, and transformers' tokenizer
giving the same ids.  A training run on a generated FASTA reports ``bits_per_base``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support import TINY_CLI_8, cli_json, raises_naming

from longseq.data.tokenizers import (
    TOKENIZERS,
    CasedNucleotideTokenizer,
    NucleotideTokenizer,
    ProteinTokenizer,
    TokenizerError,
    UnknownCharacterError,
    load_tokenizer,
)

KINDS = ("nucleotide", "nucleotide_cased", "protein")
SAMPLES = {
    "nucleotide": "ACGTNacgtn\nGATTACA[MASK]TT\n\nNNNN",
    "nucleotide_cased": "ACGTNacgtn\nGATTACA[MASK]tt\n\nNNNN",
    "protein": "MKVLAAGIV*\nmkvlxBZJUO[MASK]W\n",
}


def test_nucleotide_ids_are_fixed_and_fold_case():
    t = NucleotideTokenizer()
    assert t.symbols == ["\n", "[MASK]", "A", "C", "G", "T", "N"] and t.fit_on == "nothing"
    assert t.encode("ACGTN\nacgtn").tolist() == [2, 3, 4, 5, 6, 0, 2, 3, 4, 5, 6]
    assert t.decode(t.encode("gattaca[MASK]n")) == "GATTACA[MASK]N"
    assert t.bits_metric == "bits_per_base" and t.mask_id == 1


def test_the_cased_kind_keeps_the_soft_mask_as_ids_of_its_own():
    t = CasedNucleotideTokenizer()
    text = "ACGTNacgtn"
    ids = t.encode(text)
    assert t.decode(ids) == text and len(set(ids.tolist())) == 10
    soft = set(t.classes["soft_masked"])
    assert [i in soft for i in ids.tolist()] == [ch in "acgt" for ch in text]


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_offsets_classes_and_stored_form(kind, tmp_path):
    t = TOKENIZERS[kind]()
    text = SAMPLES[kind]
    ids = t.encode(text)
    assert t.decode(ids) == (text if kind == "nucleotide_cased" else text.upper())
    spans = t.offsets(text)
    assert "".join(text[a:b] for a, b in spans) == text and len(spans) == len(ids)
    assert t.text_bytes(ids) == len(text)  # every symbol's text is its ASCII letters
    classes = t.classes
    assert sorted(i for ids in classes.values() for i in ids) == list(range(t.vocab_size))  # a partition
    assert classes["separator"] == [0] and classes["mask"] == [t.mask_id]
    t.save(str(tmp_path / "t.json"))
    assert load_tokenizer(str(tmp_path / "t.json")).encode(text).tolist() == ids.tolist()


def test_a_stored_alphabet_other_than_this_versions_is_refused(tmp_path):
    (tmp_path / "t.json").write_text('{"kind": "nucleotide", "symbols": ["\\n", "[MASK]", "A", "C", "G", "T", "U"]}')
    with raises_naming(TokenizerError, "t.json", "'U'"):
        load_tokenizer(str(tmp_path / "t.json"))


@pytest.mark.parametrize("kind", ["nucleotide", "nucleotide_cased"])
def test_the_complement_pairs_bases_and_is_an_involution(kind):
    t = TOKENIZERS[kind]()
    complement = t.complement_ids()
    assert np.array_equal(complement[complement], np.arange(t.vocab_size))
    text = "ACGTNacgtn" if kind == "nucleotide_cased" else "ACGTN"
    assert t.decode(complement[t.encode(text)]) == text.translate(str.maketrans("ACGTacgt", "TGCAtgca"))
    assert ProteinTokenizer().complement_ids() is None


@pytest.mark.parametrize(
    "kind, text, char, line, column",
    [("nucleotide", "ACGT\nACRT", "R", 2, 3), ("nucleotide", "AC[MASK]GU", "U", 1, 10), ("protein", "MKV-L", "-", 1, 4),
     ("nucleotide", "AC[MAS]", "[", 1, 3)],
)  # fmt: skip
def test_a_letter_outside_the_alphabet_is_named_with_its_place_and_the_alphabet(kind, text, char, line, column):
    with raises_naming(UnknownCharacterError, repr(char), f"line {line}, column {column}", "alphabet") as caught:
        TOKENIZERS[kind]().encode(text)
    assert (caught.value.line, caught.value.column) == (line, column) and caught.value.advice


@pytest.mark.parametrize("kind", KINDS)
def test_transformers_reads_the_same_ids(kind, tmp_path):
    transformers = pytest.importorskip("transformers")
    from longseq.interop.hf_tokenizer import save_hf_tokenizer

    t = TOKENIZERS[kind]()
    save_hf_tokenizer(t, str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in (SAMPLES[kind], "", "[MASK]", SAMPLES[kind][::-1].replace("]KSAM[", "")):
        ids = t.encode(text).tolist()
        assert theirs.encode(text, add_special_tokens=False) == ids, text
        assert theirs.decode(ids) == t.decode(ids)
    assert theirs.mask_token_id == t.mask_id


def test_a_fasta_run_reports_bits_per_base(tmp_path, capsys):
    pytest.importorskip("Bio")
    rng = np.random.default_rng(0)
    seq = "".join(rng.choice(list("ACGT"), size=3000))
    (tmp_path / "g.fa").write_text(">chr1\n" + "\n".join(seq[i : i + 60] for i in range(0, len(seq), 60)) + "\n")
    out = tmp_path / "run"
    cli_json(["train", "--data", str(tmp_path / "g.fa"), "--out", str(out), "--json", *TINY_CLI_8,
              "tokenizer=nucleotide"], capsys)  # fmt: skip
    scores = cli_json(["eval", "--checkpoint", str(out), "--data", str(tmp_path / "g.fa"), "--split", "test", "--json"],
                      capsys)  # fmt: skip
    assert scores["bits_per_base"] == pytest.approx(scores["loss"] / math.log(2))
    assert 1.9 < scores["bits_per_base"] < math.log2(7) + 0.1  # random bases: no model reads them in under 2 bits
