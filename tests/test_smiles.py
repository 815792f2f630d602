"""Molecules: the SMILES tokenizer cuts by Schwaller et al.'s expression (``Cl``, ``Br``, bracket atoms and ring
bonds are single tokens) and gives every SMILES back exactly; unknown tokens and stray characters are named at the
file's line; ``.smi`` files read the same in RAM and prepared; with ``doc_reset`` a molecule's loss does not depend
on the molecule before it, and without it it does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import TINY_CLI_8, cli_json, raises_naming, tiny_model

from longseq.data import load_corpus, load_prepared, prepare_corpus
from longseq.data.sources import CorpusError
from longseq.data.tokenizers import TokenizerError, build_tokenizer, load_tokenizer, newline_id

MOLECULES = [
    "CCCS(=O)c1ccc2[nH]c(=NC(=O)OC)[nH]c2c1",
    "CC(C)(C)C(=O)C(Oc1ccc(Cl)cc1)n1ccnc1",
    "Cc1c(Cl)cccc1Nc1ncccc1C(=O)OCC(O)CO",
    "Brc1ccc2c(c1)C%10CCC%10N2",
    "C[C@@H](N)C(=O)[O-].[Na+]",
    "N#CC1=C(/C=C/c2ccccc2)SC(=S)N1",
]
ATOMS = ["C", "c", "N", "n", "O", "o", "S", "s", "Cl", "Br", "F", "I", "P", "B", "[nH]", "[C@@H]", "[O-]", "[NH3+]"]
LINKS = ["", "=", "#", "(", ")", "1", "2", "%10", "%23", "/", "\\", ".", "-", "+", "@", ":"]


def write_smi(directory, split_molecules: dict[str, list[str]], names: bool = False) -> None:
    for split, molecules in split_molecules.items():
        lines = [f"{m}\tmol{i}" if names else m for i, m in enumerate(molecules)]
        (directory / f"{split}.smi").write_text("".join(line + "\n" for line in lines))


def splits(n: int = 60) -> dict[str, list[str]]:
    rng = np.random.default_rng(0)
    pick = lambda k: [MOLECULES[i] for i in rng.integers(0, len(MOLECULES), size=k)]  # noqa: E731
    return {"train": pick(n), "valid": pick(12), "test": pick(12)}


def test_the_expression_keeps_atoms_rings_and_brackets_whole():
    tokenizer = build_tokenizer("smiles", "\n".join(MOLECULES) + "\n")
    pieces = [tokenizer.tokens[i] for i in tokenizer.encode(MOLECULES[3])]
    assert pieces == [
        "Br",
        "c",
        "1",
        "c",
        "c",
        "c",
        "2",
        "c",
        "(",
        "c",
        "1",
        ")",
        "C",
        "%10",
        "C",
        "C",
        "C",
        "%10",
        "N",
        "2",
    ]
    pieces = [tokenizer.tokens[i] for i in tokenizer.encode(MOLECULES[4] + "\n")]
    assert pieces[:2] == ["C", "[C@@H]"] and "[O-]" in pieces and "[Na+]" in pieces and pieces[-1] == "\n"
    assert "Cl" in tokenizer.tokens and "l" not in tokenizer.tokens


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(ATOMS + LINKS), min_size=1, max_size=30), min_size=1, max_size=8))
def test_decoding_gives_every_smiles_back_exactly(molecules):
    text = "".join("".join(tokens) + "\n" for tokens in molecules)
    tokenizer = build_tokenizer("smiles", text)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert np.array_equal(np.asarray(tokenizer.to_hf().encode(text).ids), ids)  # the transformers form cuts alike
    spans = tokenizer.offsets(text)
    assert "".join(text[a:b] for a, b in spans) == text and len(spans) == len(ids)


def test_unknown_tokens_and_stray_characters_are_named(tmp_path):
    tokenizer = build_tokenizer("smiles", "CCO\nc1ccccc1\n")
    with raises_naming(TokenizerError, "'[Xe]'", "line 2, column 3"):
        tokenizer.encode("CC\nCC[Xe]\n")
    with raises_naming(TokenizerError, "' '", "line 1, column 3", "not part of any SMILES token"):
        tokenizer.encode("CC O\n")
    tokenizer.save(str(tmp_path / "tok.json"))
    assert load_tokenizer(str(tmp_path / "tok.json")).tokens == tokenizer.tokens
    data = splits()
    data["test"][5] = "CC[Xe]C"
    (tmp_path / "src").mkdir()
    write_smi(tmp_path / "src", data, names=True)
    for read in (
        lambda: load_corpus(str(tmp_path / "src"), "smiles"),
        lambda: prepare_corpus(str(tmp_path / "src"), "smiles", str(tmp_path / "prep"), progress=False),
    ):
        with raises_naming(CorpusError, "test.smi", "line 6, column 3", "'[Xe]'"):
            read()


def test_smi_files_read_alike_in_ram_and_prepared_with_a_document_per_molecule(tmp_path):
    (tmp_path / "src").mkdir()
    data = splits()
    write_smi(tmp_path / "src", data, names=True)  # names after the SMILES are not read
    in_ram = load_corpus(str(tmp_path / "src"), "smiles")
    prepare_corpus(str(tmp_path / "src"), "smiles", str(tmp_path / "prep"), progress=False)
    prepared = load_prepared(str(tmp_path / "prep"), "smiles")
    for split, molecules in data.items():
        text = "".join(m + "\n" for m in molecules)
        assert in_ram.tokenizer.decode(in_ram.split(split)) == text
        assert np.array_equal(np.asarray(prepared.split(split)), in_ram.split(split))
        docs = in_ram.doc_ids[split][0 : len(in_ram.split(split))]
        assert docs[-1] == len(molecules)  # every line end starts the next document
    (tmp_path / "src" / "valid.smi").write_text("CCO\n\nCCN\n")
    with raises_naming(CorpusError, "valid.smi", "line 2", "no SMILES"):
        load_corpus(str(tmp_path / "src"), "smiles")


def test_doc_reset_reads_every_molecule_alone_and_carrying_reads_across():
    tokenizer = build_tokenizer("smiles", "\n".join(MOLECULES) + "\n")
    text = MOLECULES[0] + "\n" + MOLECULES[1] + "\n"
    ids = torch.as_tensor(tokenizer.encode(text))[None]
    changed = torch.as_tensor(tokenizer.encode(MOLECULES[2] + "\n" + MOLECULES[1] + "\n"))[None]
    model = tiny_model(vocab_size=tokenizer.vocab_size, mem_len=64).eval()
    nl = newline_id(tokenizer)

    def second_molecule_nll(x, reset: bool):
        docs = torch.cumsum(x == nl, dim=1) if reset else None
        out = model(x[:, :-1], None, x[:, 1:], doc_ids=None if docs is None else docs[:, :-1])
        first = int((x[0] == nl).nonzero()[0])  # the line end that starts the second molecule
        return out.nll[0, first:]

    torch.testing.assert_close(second_molecule_nll(ids, True), second_molecule_nll(changed, True), rtol=0, atol=1e-6)
    carried = (second_molecule_nll(ids, False) - second_molecule_nll(changed, False)).abs().max()
    assert carried > 1e-5  # an untrained model's attention is near uniform: the molecule before weighs in a little


def test_a_smiles_model_trains_and_generates_molecules_unprompted(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    write_smi(tmp_path / "src", splits(200))
    run = tmp_path / "run"
    cli_json(["train", "--data", str(tmp_path / "src"), "--out", str(run), "--json", *TINY_CLI_8, "tokenizer=smiles",
              "doc_reset=true"], capsys)  # fmt: skip
    sample = cli_json(["generate", "--checkpoint", str(run), "--max-new-tokens", "30", "--json"], capsys)
    tokenizer = load_tokenizer(str(run / "last" / "tokenizer.json"))
    assert sample["tokens"] == 30 and len(tokenizer.encode(sample["text"])) == 30  # 30 SMILES tokens, read back


@pytest.mark.parametrize("bad", ["CC O", "C&C"])
def test_a_character_no_token_covers_is_refused_when_fitting(bad):
    with raises_naming(TokenizerError, "line 2", "not part of any SMILES token"):
        build_tokenizer("smiles", "CCO\n" + bad + "\n")


def test_selfies_read_with_the_same_expression_one_symbol_a_token():
    selfies = pytest.importorskip("selfies")
    strings = [selfies.encoder(m) for m in MOLECULES if "." not in m]
    text = "".join(s + "\n" for s in strings)
    tokenizer = build_tokenizer("smiles", text)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert all(t == "\n" or (t.startswith("[") and t.endswith("]")) for t in tokenizer.tokens)
    assert sorted(set(tokenizer.tokens) - {"\n"}) == sorted(set(selfies.get_alphabet_from_selfies(strings)))
