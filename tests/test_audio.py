"""Audio: 8-bit mu-law round-trips on its grid, files become 16 kHz mono clips whose ids are the same in RAM and
prepared, every clip is a document, ``bits_per_sample`` counts the samples only, generation writes a playable WAV
(unprompted or continuing a file), and bad files are refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support import TINY_CLI_8, cli_json, raises_naming

sf = pytest.importorskip("soundfile")
pytest.importorskip("scipy")

from longseq.data import load_corpus, load_prepared, prepare_corpus  # noqa: E402
from longseq.data.audio import (  # noqa: E402
    CODE_BASE,
    SAMPLE_RATE,
    audio_text,
    mulaw_decode,
    mulaw_encode,
    resampled_length,
    to_mono_16k,
)
from longseq.data.sources import CorpusError, LineDocuments  # noqa: E402
from longseq.data.tokenizers import TOKENIZERS, newline_id  # noqa: E402


def tone(seconds: float, rate: int, freq: float, channels: int = 2) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.stack([0.6 * np.sin(2 * np.pi * freq * t) * (0.5 + 0.5 * c) for c in range(channels)], axis=1)


def audio_dir(directory, n: int = 3) -> list[str]:
    """``n`` files of 2.5 s tones: a 44.1 kHz stereo WAV, a 22.05 kHz FLAC, an Ogg Vorbis, ..."""
    formats = [("wav", 44100), ("flac", 22050), ("ogg", 32000)]
    paths = []
    for i in range(n):
        suffix, rate = formats[i % 3]
        path = directory / f"track{i}.{suffix}"
        sf.write(str(path), tone(2.5, rate, 220.0 * (i + 1)), rate)
        paths.append(str(path))
    return paths


def test_mulaw_round_trips_exactly_on_its_grid_and_is_close_off_it():
    codes = np.arange(256)
    assert np.array_equal(mulaw_encode(mulaw_decode(codes)), codes)
    assert np.all(np.diff(mulaw_decode(codes)) > 0)  # 256 distinct levels, in order
    x = np.linspace(-1, 1, 10001)
    compand = lambda v: np.sign(v) * np.log1p(255 * np.abs(v)) / np.log1p(255)  # noqa: E731
    assert np.abs(compand(mulaw_decode(mulaw_encode(x))) - compand(x)).max() <= 1 / 255 + 1e-12  # half a level
    assert mulaw_encode(np.array([-1.0, 1.0])).tolist() == [0, 255]


def test_resampling_to_16k_keeps_the_tone_and_the_length_it_promises():
    for rate in (44100, 22050, 48000, 8000):
        mono = to_mono_16k(tone(1.0, rate, 440.0), rate)
        assert len(mono) == resampled_length(rate, rate) == SAMPLE_RATE
        spectrum = np.abs(np.fft.rfft(mono))
        assert np.argmax(spectrum) * SAMPLE_RATE / len(mono) == pytest.approx(440.0, abs=1.0)


def test_a_file_is_its_clips_one_line_each_every_sample_a_code(tmp_path):
    path = tmp_path / "a.wav"
    sf.write(str(path), tone(2.5, 44100, 330.0), 44100)
    text = audio_text(path.read_bytes(), str(path), clip_seconds=1.0)
    lines = text.split("\n")
    assert [len(line) for line in lines] == [SAMPLE_RATE, SAMPLE_RATE]  # the 0.5 s tail is dropped
    codes = np.asarray([ord(ch) - CODE_BASE for ch in lines[0]])
    assert codes.min() == 0 and codes.max() == 255  # every clip min-max scaled to the full range
    whole = audio_text(path.read_bytes(), str(path))
    assert "\n" not in whole and len(whole) == resampled_length(int(2.5 * 44100), 44100)


def test_audio_gives_the_same_ids_in_ram_and_prepared_and_every_clip_is_a_document(tmp_path):
    (tmp_path / "src").mkdir()
    audio_dir(tmp_path / "src")
    in_ram = load_corpus(str(tmp_path / "src"), "mulaw", clip_seconds=0.5)
    prepare_corpus(str(tmp_path / "src"), "mulaw", str(tmp_path / "prep"), progress=False, clip_seconds=0.5)
    prepared = load_prepared(str(tmp_path / "prep"), "mulaw")
    newline = newline_id(in_ram.tokenizer)
    for split in ("train", "valid", "test"):
        ids = in_ram.split(split)
        assert np.array_equal(np.asarray(prepared.split(split)), ids), split
        expected = np.cumsum(ids == newline)  # a clip start begins the next document
        assert np.array_equal(in_ram.doc_ids[split][0 : len(ids)], expected)
        assert np.array_equal(prepared.doc_ids[split][3 : len(ids) - 2], expected[3:-2])
    starts = int(sum(np.count_nonzero(in_ram.split(s) == newline) for s in ("train", "valid", "test")))
    assert starts == 3 * 5 - 1  # three files of five 0.5 s clips, a start before each clip but the first
    assert sum(len(in_ram.split(s)) for s in ("train", "valid", "test")) == 15 * SAMPLE_RATE // 2 + starts


def test_line_documents_equal_the_whole_count_in_any_slice():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, size=300_000)
    docs = LineDocuments(ids, 4)
    whole = np.cumsum(ids == 4)
    for start, stop in ((0, 10), (65_530, 65_600), (131_071, 250_000), (299_990, 300_000)):
        assert np.array_equal(docs[start:stop], whole[start:stop])


def test_a_corrupt_empty_or_text_file_is_refused_by_name(tmp_path):
    for name, data in (("empty.wav", b""), ("noise.wav", b"RIFF" + bytes(range(200))), ("text.ogg", b"hello\n" * 9)):
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / name).write_bytes(data)
        with raises_naming(CorpusError, name):
            load_corpus(str(tmp_path / "src" / name), "mulaw")
    (tmp_path / "plain.txt").write_text("not audio\n" * 50)
    with raises_naming(CorpusError, "plain.txt", "line 1, column 1", "'n'"):
        load_corpus(str(tmp_path / "plain.txt"), "mulaw")
    short = tmp_path / "short.wav"
    sf.write(str(short), tone(0.2, 16000, 440.0), 16000)
    with raises_naming(CorpusError, "short.wav", "shorter than one clip"):
        load_corpus(str(short), "mulaw", clip_seconds=1.0)


def test_a_playlist_layout_keeps_whole_files_in_their_split_and_names_a_missing_one(tmp_path):
    files = audio_dir(tmp_path, 3)
    for split, path in zip(("train", "valid", "test"), files):
        (tmp_path / f"{split}.m3u").write_text(f"# {split}\n{path.split('/')[-1]}\n")
    corpus = load_corpus(str(tmp_path), "mulaw", clip_seconds=0.5)
    for split, path in zip(("train", "valid", "test"), files):
        own = load_corpus(path, "mulaw", clip_seconds=0.5)
        assert np.array_equal(corpus.split(split), np.concatenate([own.train, own.valid, own.test]))
    (tmp_path / "test.m3u").write_text("gone.wav\n")
    with raises_naming(CorpusError, "test.m3u", "line 1", "gone.wav"):
        load_corpus(str(tmp_path), "mulaw")


def test_bits_per_sample_counts_the_samples_and_not_the_clip_starts(tmp_path):
    from support import tiny_model

    from longseq.eval.evaluate import evaluate, scored_segments

    (tmp_path / "src").mkdir()
    audio_dir(tmp_path / "src")
    corpus = load_corpus(str(tmp_path / "src"), "mulaw", clip_seconds=0.01)
    tokenizer = corpus.tokenizer
    model = tiny_model(vocab_size=tokenizer.vocab_size)
    settings = {"batch_size": 2, "tgt_len": 32, "max_segments": 40}
    metrics = evaluate(model, corpus.train, bits_unit=tokenizer.bits_metric, tokenizer=tokenizer, **settings)
    nll, count, starts = 0.0, 0, 0
    for segment, losses in scored_segments(model, corpus.train, **settings):
        keep = segment.labels != newline_id(tokenizer)
        nll += float(losses[keep].double().sum())
        count += int(keep.sum())
        starts += int((~keep).sum())
    assert starts > 0  # the pass scored clip starts, which the metric leaves out
    assert metrics["bits_per_sample"] == pytest.approx(nll / count / math.log(2), rel=1e-9)
    assert metrics["bytes"] == count  # a sample is a byte of 8-bit mu-law
    assert metrics["bits_per_sample"] != pytest.approx(metrics["loss"] / math.log(2), rel=1e-9)


def test_training_evaluating_and_generating_audio_writes_playable_wavs(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    paths = audio_dir(tmp_path / "src")
    run = tmp_path / "run"
    cli_json(["train", "--data", str(tmp_path / "src"), "--out", str(run), "--json", *TINY_CLI_8, "tokenizer=mulaw",
              "clip_seconds=0.5", "doc_reset=true"], capsys)  # fmt: skip
    scores = cli_json(["eval", "--checkpoint", str(run), "--json", "--set", "max_segments=4"], capsys)
    assert 0 < scores["bits_per_sample"] <= 9  # 8 bits is a uniform guess over 256 codes
    out = tmp_path / "new.wav"
    made = cli_json(["generate", "--checkpoint", str(run), "--max-new-tokens", "40", "--out", str(out), "--json"],
                    capsys)  # fmt: skip
    info = sf.info(str(out))
    assert (info.samplerate, info.channels) == (SAMPLE_RATE, 1) and made["prompt_tokens"] == 1
    assert 30 <= info.frames <= 40  # every token drawn but the clip starts (1 in 257 for a near-uniform model)
    plot = tmp_path / "clip.png"
    cont = tmp_path / "cont.wav"
    made = cli_json(["generate", "--checkpoint", str(run), "--prompt", paths[0], "--max-new-tokens", "30",
                     "--out", str(cont), "--plot", str(plot), "--json"], capsys)  # fmt: skip
    codes = np.asarray([ord(c) - CODE_BASE for c in audio_text(open(paths[0], "rb").read(), paths[0])])
    assert made["prompt_tokens"] == len(codes) + 1  # the file's samples after a clip start
    written, rate = sf.read(str(cont))
    assert rate == SAMPLE_RATE and len(codes) + 20 <= len(written) <= len(codes) + 30
    assert np.abs(written[: len(codes)] - mulaw_decode(codes)).max() <= 1 / 32768  # the prompt, as 16-bit PCM
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_mulaw_kind_is_registered_with_its_metric():
    tokenizer = TOKENIZERS["mulaw"]()
    assert tokenizer.vocab_size == 257 and tokenizer.bits_metric == "bits_per_sample"
    text = "".join(chr(CODE_BASE + c) for c in (0, 7, 255)) + "\n" + chr(CODE_BASE + 128)
    ids = tokenizer.encode(text)
    assert ids.tolist() == [0, 7, 255, 256, 128] and tokenizer.decode(ids) == text
