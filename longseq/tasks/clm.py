"""Language-model fine-tuning (``longseq finetune --task clm``): a checkpoint (an imported pretrained model, or any
longseq language model) goes on predicting the next token, on a text of the user's, read as language-model training
reads it: ordered segments, the memory carried from one step to the next and back-propagated through ``mem_bptt``
segments, layer-wise learning-rate decay, optionally LoRA adapters (:mod:`longseq.tasks.adapters`) in place of the
weights.  Its checkpoints are language models (``eval``, ``generate``, ``convert``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from torch import nn

from longseq.config.base import ConfigError
from longseq.config.run import RunConfig
from longseq.config.task import ClmOptions
from longseq.data.corpus import load_corpus
from longseq.model import TransformerXLLM, build_model
from longseq.tasks.adapters import adapter_parameters, add_adapters, base_state
from longseq.tasks.base import load_base
from longseq.tasks.lm import LanguageModeling


class FinetuneLM(LanguageModeling):
    """Options (:class:`~longseq.config.task.ClmOptions`): the fine-tuning options, ``train`` a text."""

    name = "clm"
    Options = ClmOptions

    def __init__(self, run: RunConfig, tokenizer=None, log=None, base: nn.Module | None = None, corpus=None) -> None:
        super().__init__(run, tokenizer, log, corpus)
        self.base = base

    @classmethod
    def checkpoint_kind(cls) -> str:
        return "a language model fine-tuned on a text (longseq eval, generate and convert read it)"

    def prepare(self) -> RunConfig:
        """The text of ``train`` as the corpus (with the checkpoint's tokenizer), ``valid``'s whole text as its
        validation split when given."""
        o = self.options
        self.run = RunConfig(self.run.model, self.run.data.replace(path=o.train), self.run.train, self.run.task)
        if o.valid and self.corpus is None:
            corpus = load_corpus(o.train, self.run.data.tokenizer, tokenizer=self.tokenizer)
            held = load_corpus(o.valid, self.run.data.tokenizer, tokenizer=self.tokenizer)
            if corpus.doc_ids is not None:
                raise ConfigError(f"task.valid {o.valid}: documents kept apart (a directory) validate on their own")
            whole = np.concatenate([held.train, held.valid, held.test])
            self.corpus = replace(corpus, valid=whole, test=whole)
        return super().prepare()

    def build_model(self) -> nn.Module:
        model = build_model(self.run.model)
        o = self.options
        if o.lora_rank:
            add_adapters(model, o.lora_rank, o.lora_alpha, o.lora_dropout, o.lora_targets)
        return model

    def initialize(self, model: TransformerXLLM) -> None:
        if self.base is None:
            return
        if self.options.lora_rank:  # the base weights under the adapted linears' names
            model.load_state_dict(base_state(model, self.base.state_dict()))
        else:
            load_base(model, self.base)

    def trainable(self, model: TransformerXLLM) -> list | None:
        if self.options.lora_rank:
            return adapter_parameters(model)
        return list(model.crit.parameters()) if self.options.head_only else None

    def report(self, model: nn.Module) -> dict:
        return {"valid": self.validate(model)}
