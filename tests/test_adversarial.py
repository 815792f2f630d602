"""The adversarial pass of the reliability issue: ways a careful newcomer lost work, got a silently wrong number or a
bare traceback that the fifteen reported items did not cover.  One regression test each, on tiny models."""

import pytest
import torch
from test_train import tiny_corpus, tiny_run

from longseq.model import TransformerXLLM


def tiny_model(**model_overrides) -> TransformerXLLM:
    torch.manual_seed(0)
    config = tiny_run().model
    return TransformerXLLM(config.replace(**model_overrides) if model_overrides else config)


def test_an_evaluation_that_scores_no_token_is_an_error_not_a_loss_of_zero():
    """``eval --context-curve 0,8 --skip-segments 1000`` printed loss 0.0 (a perfect model) over 0 tokens."""
    from longseq.eval.context import context_curve
    from longseq.eval.evaluate import evaluate

    model, ids = tiny_model(), tiny_corpus().valid[:81]  # 2 streams of 40: 5 segments of 8
    last = evaluate(model, ids, batch_size=2, tgt_len=8, skip_segments=4)
    assert last["tokens"] == 2 * 7 and last["loss"] > 0  # the last, shorter segment is scored alone
    for skip in (5, 1000):
        with pytest.raises(ValueError, match=f"no token was scored: the pass read 5 segment.* skip_segments={skip}"):
            evaluate(model, ids, batch_size=2, tgt_len=8, skip_segments=skip)
        with pytest.raises(ValueError, match="no token was scored"):
            context_curve(model, ids, [0, 8], tgt_len=8, batch_size=2, skip_segments=skip)
