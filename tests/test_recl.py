"""RECL on constructed loss curves, against answers computed by hand from the paper's definition."""

import math

import numpy as np
import pytest

from longseq.eval.recl import recl, relative_gain


def curves(**per_length):
    return {int(k[1:]): np.array(v, dtype=float) for k, v in per_length.items()}


def test_recl_of_a_group_follows_the_common_baseline():
    group = {
        "a": curves(c10=[2, 2, 2, 2], c20=[1, 1, 1, 1], c30=[1, 1, 1, 1]),
        "b": curves(c10=[3, 3, 3, 3], c20=[3, 3, 3, 3], c30=[3, 3, 3, 3]),
    }
    # 10 -> 20: baseline min(a, b) = 2; a: f = 2 -> 1, gain 1 - 1/e; b never beats the baseline: gain 0
    assert relative_gain(group, "a", 10, 20, 1.0) == pytest.approx(1 - math.exp(-1))
    assert relative_gain(group, "b", 10, 20, 1.0) == 0.0
    # 20 -> 30: the baseline is now a's own loss 1 and nothing improves on it
    assert recl(group) == {"a": 20, "b": 10}


def test_r_restricts_the_gain_to_the_hardest_tokens():
    model = {"m": curves(c10=[3, 1, 1, 1], c20=[2.96, 1, 1, 1], c30=[2.96, 1, 1, 1])}
    # r = 1: f drops by 0.04 / 4 = 0.01, gain 1 - e^-0.01 = 0.00995 < 0.01: RECL stays at 10
    assert relative_gain(model, "m", 10, 20, 1.0) == pytest.approx(1 - math.exp(-0.01))
    assert recl(model, r=1.0) == {"m": 10}
    # r = 0.25 keeps only the token with the largest baseline: gain 1 - e^-0.04 = 0.039
    assert relative_gain(model, "m", 10, 20, 0.25) == pytest.approx(1 - math.exp(-0.04))
    assert recl(model, r=0.25) == {"m": 20}


def test_recl_rejects_misaligned_inputs():
    with pytest.raises(ValueError, match="evaluated at"):
        recl({"a": curves(c10=[1.0], c20=[1.0]), "b": curves(c10=[1.0])})
    with pytest.raises(ValueError, match="same tokens"):
        recl({"a": curves(c10=[1.0], c20=[1.0]), "b": curves(c10=[1.0, 2.0], c20=[1.0, 2.0])})
    with pytest.raises(ValueError, match="r must be"):
        relative_gain({"a": curves(c10=[1.0], c20=[1.0])}, "a", 10, 20, 0.0)
