"""Synthetic recall tasks: seeded generators of any length, no files.  Each draws a batch from ``(seed, index)``
alone, so a stream of batches is a counter and a resumed run draws the same ones.

Every sequence is token ids below 256 (the byte vocabulary), ``labels`` hold the token a position must predict
(-100 where nothing is asked) and ``distance`` how far back, from the position asked, the answer's source token
lies (-1 where nothing is asked).  Formats:

* ``passkey`` (Mohtashami & Jaggi, 2023): random filler, a KEY marker and ``key_len`` digits at a chosen
  ``distance`` before the end (drawn log-uniformly when not given), a QUERY marker, then the digits asked one
  by one (teacher-forced).
  Chance: 1/10 a digit.
* ``mqar`` (Zoology, Arora et al., 2023): ``n_pairs`` key-value pairs (keys from 1..127, values from 128..255),
  then zeros with every key asked once at a random place; the position of a query predicts its value.
  Zoology draws from 8,192 tokens and places queries by a power law; here 127 keys and uniform places.
* ``copying`` (selective copying, Mamba Table 1): ``n_copy`` tokens (1..alphabet-2) at random places in noise
  (0), a separator (alphabet-1), then the tokens asked in order.  Chance 1/(alphabet-2).
* ``induction`` (induction heads, Mamba Table 2): random tokens (1..alphabet-1), a special token (0) somewhere
  followed by a token, and the special token again at the end, which must predict that token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from longseq.config.task import RECALL_TASKS, RecallOptions

IGNORE = -100
KEY, QUERY, FILLER = 10, 11, 12  # passkey: digits are ids 0-9
MQAR_VALUES = 128  # mqar: keys 1..127, values 128..255


@dataclass(frozen=True)
class RecallBatch:
    """``inputs``, ``labels`` and ``distance``: (B, N) int64 tensors (see the module docstring)."""

    inputs: Tensor
    labels: Tensor
    distance: Tensor

    def rows(self, rows: slice) -> RecallBatch:
        return RecallBatch(self.inputs[rows], self.labels[rows], self.distance[rows])


def chance(options: RecallOptions) -> float:
    """The accuracy of guessing a label uniformly among the tokens the task asks for."""
    name = options.name  # only the named task's formula is evaluated: another's may not apply to these options
    if name == "passkey":
        return 1 / 10
    if name == "mqar":
        return 1 / options.n_pairs
    return 1 / (options.alphabet - 2) if name == "copying" else 1 / (options.alphabet - 1)


def shortest(options: RecallOptions) -> int:
    """The shortest sequence the task's format fits in."""
    return {
        "passkey": 2 * options.key_len + 2,
        "mqar": 3 * options.n_pairs,
        "copying": 2 * options.n_copy + 1,
        "induction": 4,
    }[options.name]


def recall_batch(
    options: RecallOptions, seed: int, index: int, batch: int, length: int, distance: int | None = None
) -> RecallBatch:
    """Batch ``index`` of the stream ``seed``: ``batch`` sequences of ``length`` tokens of the task
    ``options.name``.  ``distance`` fixes the passkey's distance (default: drawn within the options' bounds)."""
    if options.name not in RECALL_TASKS:
        raise ValueError(f"{options.name!r} is not a recall task; known: {', '.join(RECALL_TASKS)}")
    if length < shortest(options):
        raise ValueError(
            f"a {options.name} sequence with these options needs >= {shortest(options)} tokens, got length {length}"
        )
    if distance is not None and options.name != "passkey":
        raise ValueError(f"distance is chosen by the passkey task only, not by {options.name}")
    rng = np.random.default_rng([seed, index])
    inputs = np.zeros((batch, length), np.int64)
    labels = np.full((batch, length), IGNORE, np.int64)
    dist = np.full((batch, length), -1, np.int64)
    for row in range(batch):
        GENERATORS[options.name](rng, options, inputs[row], labels[row], dist[row], distance)
    return RecallBatch(torch.from_numpy(inputs), torch.from_numpy(labels), torch.from_numpy(dist))


def passkey_distances(options: RecallOptions, length: int) -> tuple[int, int]:
    """The passkey distances a sequence of ``length`` tokens allows within the options' bounds."""
    low, high = max(options.key_len, options.min_distance), length - options.key_len - 1
    if options.max_distance:
        high = min(high, options.max_distance)
    if low > high:
        raise ValueError(f"no passkey distance in [{low}, {high}] fits {length} tokens with key_len {options.key_len}")
    return low, high


def log_uniform(rng, low: int, high: int) -> int:
    """An integer in [low, high] drawn log-uniformly: every scale of distance is trained alike."""
    return min(high, int(np.exp(rng.uniform(np.log(low), np.log(high + 1)))))


def _passkey(rng, o: RecallOptions, inputs, labels, dist, distance) -> None:
    n, k = len(inputs), o.key_len
    low, high = passkey_distances(o, n)
    d = log_uniform(rng, low, high) if distance is None else distance
    if not low <= d <= n - k - 1:
        raise ValueError(f"passkey distance {d} does not fit {n} tokens with key_len {k} (range [{low}, {n - k - 1}])")
    inputs[:] = FILLER + rng.integers(0, o.alphabet, n)
    key, q = rng.integers(0, 10, k), n - k  # the query marker at q; the digits asked at q .. n - 1
    p = q - d  # the first digit
    inputs[p - 1], inputs[p : p + k] = KEY, key
    inputs[q], inputs[q + 1 :] = QUERY, key[:-1]
    labels[q:], dist[q:] = key, d


def _mqar(rng, o: RecallOptions, inputs, labels, dist, distance) -> None:
    pairs, n = o.n_pairs, len(inputs)
    keys = rng.choice(np.arange(1, MQAR_VALUES), pairs, replace=False)
    values = rng.integers(MQAR_VALUES, 256, pairs)
    inputs[0 : 2 * pairs : 2], inputs[1 : 2 * pairs : 2] = keys, values
    where = np.sort(rng.choice(np.arange(2 * pairs, n), pairs, replace=False))
    order = rng.permutation(pairs)
    inputs[where], labels[where] = keys[order], values[order]
    dist[where] = where - (2 * order + 1)


def _copying(rng, o: RecallOptions, inputs, labels, dist, distance) -> None:
    n, c = len(inputs), o.n_copy
    sep = n - c  # the separator's position; the tokens asked at sep .. n - 1
    where = np.sort(rng.choice(sep, c, replace=False))
    tokens = rng.integers(1, o.alphabet - 1, c)
    inputs[where], inputs[sep], inputs[sep + 1 :] = tokens, o.alphabet - 1, tokens[:-1]
    labels[sep:], dist[sep:] = tokens, np.arange(sep, n) - where


def _induction(rng, o: RecallOptions, inputs, labels, dist, distance) -> None:
    n = len(inputs)
    inputs[:] = rng.integers(1, o.alphabet, n)
    first = int(rng.integers(0, n - 2))  # the special token; the token to recall follows it
    inputs[first], inputs[n - 1] = 0, 0
    labels[n - 1], dist[n - 1] = inputs[first + 1], n - 2 - first


GENERATORS = {"passkey": _passkey, "mqar": _mqar, "copying": _copying, "induction": _induction}


class RecallBatches:
    """The training stream: batch ``index`` of stream ``seed`` at each ``next()``; the state is the counter."""

    def __init__(self, options: RecallOptions, seed: int, batch: int) -> None:
        self.options, self.seed, self.batch, self.index = options, seed, batch, 0

    def next(self) -> RecallBatch:
        self.index += 1
        return recall_batch(self.options, self.seed, self.index, self.batch, self.options.seq_len)

    def state_dict(self) -> dict:
        return {"index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.index = int(state["index"])
