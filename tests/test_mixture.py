"""One vocabulary across modalities: a ``.mix`` list reads text, DNA, audio and SMILES files each after its modality's
token; every section's ids are those of its modality's own tokenizer, shifted; RAM and prepared give equal ids;
decoding gives the text back; the bits metric leaves out markers and clip starts; bad lists are named at their line."""

from __future__ import annotations

import numpy as np
import pytest
from support import TINY_CLI_8, cli_json, raises_naming

sf = pytest.importorskip("soundfile")

from longseq.data import load_corpus, load_prepared, prepare_corpus  # noqa: E402
from longseq.data.sources import CorpusError  # noqa: E402
from longseq.data.tokenizers import TokenizerError, build_tokenizer  # noqa: E402
from longseq.data.tokenizers.mixture import NAMES, marker  # noqa: E402

SPLITS = ("train", "valid", "test")


def mixture_dir(directory) -> dict[str, str]:
    """A file of each modality and ``{train,valid,test}.mix`` listing them all; the file of each modality."""
    t = np.arange(8000) / 16000
    sf.write(str(directory / "tone.wav"), 0.5 * np.sin(2 * np.pi * 300 * t), 16000)
    (directory / "prose.txt").write_text("to be or not to be\nthat is the question é\n" * 3)
    (directory / "genome.txt").write_text("ACGTTGCAAC\nGGCCAATTNA\n" * 4)
    (directory / "mols.smi").write_text("CCO\nc1ccccc1Cl\nC[C@@H](N)C(=O)O\n")
    files = {"text": "prose.txt", "dna": "genome.txt", "audio": "tone.wav", "smiles": "mols.smi"}
    for split in SPLITS:
        (directory / f"{split}.mix").write_text("# all four\n" + "".join(f"{m} {f}\n" for m, f in files.items()))
    return files


def test_every_section_is_its_modalitys_own_ids_shifted_and_ram_equals_prepared(tmp_path):
    (tmp_path / "src").mkdir()
    files = mixture_dir(tmp_path / "src")
    corpus = load_corpus(str(tmp_path / "src"), "mixture", clip_seconds=0.125)
    tokenizer = corpus.tokenizer
    ids = corpus.train
    starts = [int(i) for i in np.flatnonzero(ids < len(NAMES))]
    assert [int(ids[s]) for s in starts] == [0, 1, 2, 3]  # the modality tokens, in the list's order
    ranges = tokenizer.ranges()
    for k, (modality, name) in enumerate(files.items()):
        section = ids[starts[k] + 1 : starts[k + 1] if k + 1 < len(starts) else len(ids)]
        alone = load_corpus(str(tmp_path / "src" / name), tokenizer.parts[k].kind if modality != "dna" else "char",
                            clip_seconds=0.125)  # fmt: skip
        own = np.concatenate([alone.train, alone.valid, alone.test])
        expected = own if k == len(files) - 1 else np.append(own, alone.tokenizer.encode("\n"))  # the join
        if modality in ("text", "audio"):  # fixed vocabularies: the same ids exactly
            assert np.array_equal(section - ranges[modality][0], expected), modality
        assert tokenizer.parts[k].decode(section - ranges[modality][0]) == alone.tokenizer.decode(expected)
        assert ((section >= ranges[modality][0]) & (section < ranges[modality][1])).all()
    prepare_corpus(str(tmp_path / "src"), "mixture", str(tmp_path / "prep"), progress=False, clip_seconds=0.125)
    prepared = load_prepared(str(tmp_path / "prep"), "mixture")
    for split in SPLITS:
        assert np.array_equal(np.asarray(prepared.split(split)), corpus.split(split))
    assert tokenizer.decode(ids).startswith(marker("text") + "to be or not")


def test_the_metric_leaves_out_markers_and_clip_starts_and_decoding_round_trips():
    text = (
        marker("text") + "ab\n" + marker("audio") + chr(0xE000 + 5) + "\n" + chr(0xE000 + 9) + marker("smiles") + "CO\n"
    )
    tokenizer = build_tokenizer("mixture", text)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and len(tokenizer.offsets(text)) == len(ids)
    kept = tokenizer.scored(ids)
    audio = tokenizer.ranges()["audio"][0]
    assert [int(i) for i in ids[~kept]] == [0, 2, audio + 256, 3]  # three markers and the clip start
    with raises_naming(TokenizerError, "modality token"):
        tokenizer.encode("no marker here")
    with raises_naming(TokenizerError, "'X'", "line 1", "smiles vocabulary"):
        tokenizer.encode(marker("smiles") + "CXC")


def test_a_bad_list_is_named_at_its_line(tmp_path):
    (tmp_path / "src").mkdir()
    mixture_dir(tmp_path / "src")
    (tmp_path / "src" / "valid.mix").write_text("text prose.txt\nsound tone.wav\n")
    with raises_naming(CorpusError, "valid.mix", "line 2", "'sound'"):
        load_corpus(str(tmp_path / "src"), "mixture")
    (tmp_path / "src" / "valid.mix").write_text("text prose.txt\n\naudio gone.wav\n")
    with raises_naming(CorpusError, "valid.mix", "line 3", "gone.wav"):
        load_corpus(str(tmp_path / "src"), "mixture")


def test_a_mixture_model_trains_and_reports_its_bits(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    mixture_dir(tmp_path / "src")
    run = tmp_path / "run"
    cli_json(["train", "--data", str(tmp_path / "src"), "--out", str(run), "--json", *TINY_CLI_8, "tokenizer=mixture",
              "clip_seconds=0.125"], capsys)  # fmt: skip
    scores = cli_json(["eval", "--checkpoint", str(run), "--json", "--set", "max_segments=3"], capsys)
    assert 0 < scores["bits_per_token"] < 12
