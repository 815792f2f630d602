"""Attention transfer, the first stage of linearization (LoLCATs, Zhang et al., 2024): the run's model is its
teacher with chosen attention layers replaced by mixers (:mod:`longseq.tasks.linearize`), and only those mixers
train, so that each replaced layer gives what the teacher's layer gave on the teacher's own inputs::

    loss = mean over replaced layers i of  MSE(student layer i (h_i), teacher layer i (h_i))

with h_i the teacher's input to layer i (its ``layer_outputs``).  Because every replaced layer reads the teacher's
inputs, not the output of a replaced layer before it, the layers learn side by side in one pass and each layer's
loss is its own: they train all at once, and layers chosen later keep what they learnt here.  The compared outputs
are the whole layers' (mixer and feed-forward, the residual included), as ``layer_outputs`` gives them; the last
layer's after the final norm where the model has one.

**What a step reads.**  Each optimizer step reads ``task.step_segments`` consecutive segments of the training streams
from an empty memory: the teacher's memory and the student's (its mixers' states) are carried from segment to
segment within the step, and start empty at the next.  The Trainer carries one memory from step to step, the
model's own; here two models read in step, and the teacher's memory is no part of the run's state.  Starting each
step afresh keeps the run's state what the Trainer saves (weights, optimizer, data position, RNG), so a resumed
run is exact, and ``step_segments`` sets how long a state the mixers learn to carry (the teacher's memory fills in the
same window).  Validation reads the validation split in one ordered pass with both memories carried.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F

from longseq.config.base import ConfigError
from longseq.config.task import TransferOptions
from longseq.data.batching import OrderedStream
from longseq.model.spec import first_of
from longseq.model.stack import LayerStack
from longseq.tasks.base import StepContext, StepResult
from longseq.tasks.distill import Teacher, read_with_teacher, same_teacher
from longseq.tasks.linearize import init_from_teacher, layer_prefix, replaced_layers
from longseq.tasks.lm import LanguageModeling, row_chunks


@contextlib.contextmanager
def feeding(model: torch.nn.Module, layers: list[int], inputs: list):
    """While open, layer i of ``model``'s stack (for i in ``layers``) reads ``inputs[i]`` in place of its own input
    (a forward pre-hook each)."""
    stack = first_of(model, LayerStack).layers
    hooks = [stack[i].register_forward_pre_hook(lambda module, args, i=i: (inputs[i], *args[1:])) for i in layers]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


class AttentionTransfer(LanguageModeling):
    """Attention transfer (see the module docstring); options :class:`TransferOptions`."""

    name = "transfer"
    Options = TransferOptions
    writes_samples = False

    def __init__(self, run, tokenizer=None, log=None, corpus=None, teacher: Teacher | None = None) -> None:
        super().__init__(run, tokenizer, log, corpus)
        self.teacher, self.layers = teacher, []

    def prepare(self):
        path, teacher, teacher_run = read_with_teacher(self, "transfer")
        super().prepare()
        sha = same_teacher(path, self.options.teacher_sha256)
        self.layers = replaced_layers(teacher_run.model, self.run.model)
        if not self.layers:
            raise ConfigError(f"the run's model replaces none of the attention layers of its teacher {path}")
        teacher.eval().requires_grad_(False)
        self.set_options(teacher=os.path.abspath(path), teacher_sha256=sha)
        self.log(f"transfer: layers {', '.join(map(str, self.layers))} learn their teacher's outputs")
        return self.run

    def initialize(self, model) -> None:
        """A new run's student: the teacher's weights, its attention's q, k, v and o in the replaced layers."""
        init_from_teacher(model, self.teacher.model.state_dict(), self.teacher.run.model, self.layers)

    def trainable(self, model):
        """The replaced layers' mixers only."""
        own = tuple(layer_prefix(i) + "mixer." for i in self.layers)
        return [p for name, p in model.named_parameters() if name.startswith(own)]

    def window(self) -> int:
        return self.options.step_segments

    def unigram_bpc(self):
        return None

    def _teacher_on(self, device) -> torch.nn.Module:
        return self.teacher.model.to(device)

    def losses(self, net, teacher, inputs, docs, mems) -> tuple[torch.Tensor, tuple]:
        """Each replaced layer's MSE (n,) on one segment, and the two memories after it."""
        taught: list = []
        with torch.no_grad():
            t = teacher(inputs, mems[0], doc_ids=docs, return_hidden=True, layer_outputs=taught)
        made: list = []
        with feeding(net, self.layers, taught):
            s = net(inputs, mems[1], doc_ids=docs, return_hidden=True, layer_outputs=made)
        mse = [F.mse_loss(made[i + 1].float(), taught[i + 1].float()) for i in self.layers]
        return torch.stack(mse), (t.mems, s.mems)

    def train_step(self, ctx: StepContext, segments: list, memory) -> StepResult:
        """Each chunk of rows through the step's window from empty memories, one backward per chunk."""
        teacher, accum, window = self._teacher_on(ctx.device), ctx.grad_accum, len(segments)
        pieces = [row_chunks(segment, ctx.device, accum) for segment in segments]
        loss_sum = 0.0
        for c in range(accum):
            pending, mems = None, (None, None)
            for segment, chunks in zip(segments, pieces):
                inputs, _, docs, _ = chunks[c]
                if segment.new_epoch:
                    mems = (None, None)
                with ctx.autocast():
                    mse, mems = self.losses(ctx.net, teacher, inputs, docs, mems)
                loss = mse.mean()
                pending = loss if pending is None else pending + loss
                loss_sum = loss_sum + loss.detach().float()
            ctx.backward(pending / (accum * window))
        tokens = sum(seg.labels.numel() for seg in segments)
        return StepResult(loss_sum / (accum * window), None, tokens)

    @torch.no_grad()
    def validate(self, model, sharded: bool = False) -> dict:
        """The mean MSE (``loss``) and each layer's over the validation split, read in one ordered pass with both
        memories carried (the first ``eval_max_segments`` segments; 0: all)."""
        d, valid = self.run.data, self.corpus.valid
        stream = OrderedStream(valid, min(d.eval_batch_size, max(1, len(valid) // 2)), d.eval_tgt_len)
        device = next(model.parameters()).device
        teacher, limit = self._teacher_on(device), self.run.train.eval_max_segments
        was, totals, read, mems = model.training, None, 0, (None, None)
        model.eval()
        try:
            while (segment := stream.next_segment(cycle=False)) is not None and (not limit or read < limit):
                mse, mems = self.losses(model, teacher, segment.input_ids.to(device), None, mems)
                totals, read = (mse if totals is None else totals + mse), read + 1
        finally:
            model.train(was)
        if totals is None:
            return {}
        means = (totals / read).tolist()
        return {"loss": sum(means) / len(means), **{f"mse_layer{i}": m for i, m in zip(self.layers, means)}}
