"""Raw audio as tokens: decoding files, 16 kHz mono, 8-bit mu-law, and the text form the corpora carry.

SaShiMi's protocol (Goel et al., 2022, after WaveNet, van den Oord et al., 2016): audio at 16 kHz, mono; every clip
min-max scaled to [-1, 1]; mu-law companding with mu = 255, ``y = sign(x) ln(1 + mu |x|) / ln(1 + mu)``; 256 levels,
``code = floor((y + 1) / 2 * mu + 0.5)``; decoding ``x = sign(y) ((1 + mu)^|y| - 1) / mu`` with ``y = 2 code / mu - 1``.
A code decoded and encoded again is the same code (the quantized grid round-trips exactly).

How samples travel through a pipeline built for text: a mu-law code ``c`` is the character ``chr(CODE_BASE + c)``
(U+E000 + c, the Unicode private-use area, which no text holds), and a clip is a line of such characters: clips are
joined by ``\\n``, which starts the next clip.  So the readers (:mod:`longseq.data.readers.audio`) give text, the
corpora, prepared files and the document machinery carry it unchanged, the ``mulaw`` tokenizer
(:mod:`longseq.data.tokenizers.mulaw`) maps each character to its code 1:1 and ``\\n`` to one more id (the clip
start, the prompt of unprompted generation), and nothing can mistake audio for text: a plain text file read with
``--tokenizer mulaw`` is refused at its first character.

Files are decoded by ``soundfile`` (libsndfile: WAV, FLAC, Ogg Vorbis, AIFF) and resampled by
``scipy.signal.resample_poly``: a polyphase FIR (Kaiser window), zero phase, with an exact output length of
``ceil(n * up / down)``; both are the optional extra ``audio``.  soxr would be faster and streams, but scipy is on
every researcher's machine and a whole track (minutes) fits in memory.
"""

from __future__ import annotations

import io
import math

import numpy as np

SAMPLE_RATE = 16_000
MU = 255
CODE_BASE = 0xE000  # the character of mu-law code 0
CODES = 256


class AudioError(ValueError):
    """An audio file that cannot be read: corrupt, empty, of an unknown format, or holding non-finite samples."""


def _soundfile():
    try:
        import soundfile
    except ImportError:
        raise ImportError("reading audio needs soundfile and scipy: pip install 'longseq[audio]'") from None
    return soundfile


def read_audio(data: bytes, path: str) -> tuple[np.ndarray, int]:
    """The samples of the audio file whose bytes are ``data`` (float64, (frames, channels)) and its sample rate; a
    file that cannot be decoded, holds no sample or a non-finite one is an :class:`AudioError` naming ``path``."""
    soundfile = _soundfile()
    if not data:
        raise AudioError(f"{path} is empty (0 bytes): not an audio file")
    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float64", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioError(f"{path} cannot be decoded as audio ({exc}); longseq reads WAV, FLAC, Ogg and AIFF") from None
    if samples.shape[0] == 0:
        raise AudioError(f"{path} holds no audio samples (0 frames)")
    bad = np.flatnonzero(~np.isfinite(samples).all(axis=1))
    if bad.size:
        raise AudioError(f"{path}: sample {int(bad[0])} (frame index) is not a finite number")
    return samples, int(rate)


def frames_of(path: str) -> tuple[int, int]:
    """(frames, sample rate) of an audio file from its header, without decoding it."""
    soundfile = _soundfile()
    try:
        info = soundfile.info(path)
    except (soundfile.LibsndfileError, RuntimeError) as exc:
        raise AudioError(f"{path} cannot be decoded as audio ({exc})") from None
    return int(info.frames), int(info.samplerate)


def resampled_length(frames: int, rate: int, target: int = SAMPLE_RATE) -> int:
    """The samples :func:`to_mono_16k` gives for ``frames`` at ``rate``: ``ceil(frames * up / down)``."""
    g = math.gcd(target, rate)
    return -(-frames * (target // g) // (rate // g))


def to_mono_16k(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """``samples`` (frames, channels) as one channel (the mean of the channels) at ``target`` Hz, float64."""
    mono = samples.mean(axis=1)
    if rate == target:
        return mono
    from scipy.signal import resample_poly

    g = math.gcd(target, rate)
    return resample_poly(mono, target // g, rate // g)


def minmax(clip: np.ndarray) -> np.ndarray:
    """``clip`` scaled to [-1, 1] by its own minimum and maximum (SaShiMi's ``minmax_scale``); a constant clip is 0."""
    low, high = float(clip.min()), float(clip.max())
    if high == low:
        return np.zeros_like(clip)
    return (clip - low) / (high - low) * 2.0 - 1.0


def mulaw_encode(x: np.ndarray) -> np.ndarray:
    """Mu-law codes 0..255 of samples in [-1, 1] (values outside are clipped)."""
    x = np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0)
    y = np.sign(x) * np.log1p(MU * np.abs(x)) / np.log1p(MU)
    return np.floor((y + 1.0) / 2.0 * MU + 0.5).astype(np.int64)


def mulaw_decode(codes: np.ndarray) -> np.ndarray:
    """Samples in [-1, 1] of mu-law ``codes`` (0..255), float64."""
    y = np.asarray(codes, dtype=np.float64) / MU * 2.0 - 1.0
    return np.sign(y) * ((1.0 + MU) ** np.abs(y) - 1.0) / MU


def clips(samples: np.ndarray, clip_samples: int) -> list[np.ndarray]:
    """``samples`` cut into clips of ``clip_samples`` (0: one clip of all), a shorter tail dropped (SaShiMi's clips
    are all of one length)."""
    if clip_samples <= 0:
        return [samples]
    return [samples[i : i + clip_samples] for i in range(0, len(samples) - clip_samples + 1, clip_samples)]


def clip_samples(clip_seconds: float) -> int:
    return int(round(clip_seconds * SAMPLE_RATE))


def codes_text(codes: np.ndarray) -> str:
    """Mu-law ``codes`` as their characters (U+E000 + code)."""
    return (np.asarray(codes, dtype=np.uint32) + CODE_BASE).astype("<u4").tobytes().decode("utf-32-le")


def audio_text(data: bytes, path: str, clip_seconds: float = 0.0) -> str:
    """The text of an audio file (its bytes ``data``): 16 kHz mono, cut into clips of ``clip_seconds`` (0: the whole
    file), each min-max scaled and mu-law coded, one line each (see the module docstring).  A file shorter than one
    clip is an :class:`AudioError`."""
    samples, rate = read_audio(data, path)
    mono = to_mono_16k(samples, rate)
    parts = clips(mono, clip_samples(clip_seconds))
    if not parts:
        raise AudioError(
            f"{path} lasts {len(mono) / SAMPLE_RATE:.2f} s, shorter than one clip of {clip_seconds:g} s: "
            "lower data.clip_seconds, or leave the file out"
        )
    return "\n".join(codes_text(mulaw_encode(minmax(part))) for part in parts)


def audio_text_bytes(path: str, clip_seconds: float = 0.0) -> int:
    """The UTF-8 bytes of :func:`audio_text` of ``path``, from its header (3 a sample, 1 a clip's ``\\n``)."""
    frames, rate = frames_of(path)
    n = resampled_length(frames, rate)
    size = clip_samples(clip_seconds)
    records = max(1, n // size) if size > 0 else 1
    samples = records * size if size > 0 else n
    return 3 * samples + records - 1


def write_wav(path: str, samples: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """``samples`` in [-1, 1] written as 16-bit PCM WAV, atomically (a temporary name, then renamed)."""
    import os

    soundfile = _soundfile()
    tmp = f"{path}.tmp-{os.getpid()}.wav"
    try:
        soundfile.write(tmp, np.clip(np.asarray(samples, dtype=np.float64), -1.0, 1.0), rate, subtype="PCM_16")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
