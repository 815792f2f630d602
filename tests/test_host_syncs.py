"""No host synchronisation in the model: the forward and backward of every pattern, mixer and memory option read
nothing back from the device (on a GPU each read stalls the CPU until the queue drains).  Counted on the CPU with
a dispatch mode (:class:`longseq.diagnostics.syncs.HostSyncs`), which sees the operators a GPU would wait on."""

from __future__ import annotations

import pytest
import torch

from longseq import ModelConfig, TransformerXLLM
from longseq.diagnostics.syncs import HostSyncs
from longseq.model import Memory

BASE = dict(vocab_size=50, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, mem_len=16, attn_chunk=8)
CASES = {  # a name: (model settings, call settings); attn_chunk 8 over 32 queries takes the banded and sparse paths
    "full": ({}, {}),
    "window": ({"attention": ["window"], "window": 4}, {}),
    "dilated": ({"attention": ["dilated"], "window": 4, "dilation": [1, 2]}, {}),
    "strided": ({"attention": ["strided"], "window": 4, "stride": 4}, {}),
    "block_sparse": ({"attention": ["block_sparse"], "block_size": 4}, {}),
    "global": ({"attention": ["global"], "window": 4, "num_global": 2}, {}),
    "bigbird": ({"attention": ["bigbird"], "window": 4, "block_size": 4, "num_global": 1, "num_random_blocks": 1}, {}),
    "shaw": ({"pos": "shaw"}, {}),
    "absolute": ({"pos": "absolute", "mem_len": 0}, {}),
    "ssm": ({"mixer": ["ssm"]}, {}),
    "conv": ({"mixer": ["conv"]}, {"docs": True}),
    "rnn": ({"mixer": ["rnn"]}, {}),
    "hybrid with documents": ({"mixer": ["ssm", "attention"]}, {"docs": True}),
    "hourglass": ({"n_layer": 3, "shorten_layers": [1, 2], "mem_len": 8}, {}),
    "compressive (learned)": ({"cmem_len": 4, "cmem_rate": 2, "cmem_fn": "conv"}, {}),
    "8-bit memory": ({"mem_quant": "int8"}, {}),
    "pruned memory": ({"mem_select": "attention"}, {}),
    "memory tokens": ({"mem_tokens": 2}, {}),
    "memory dropout": ({"mem_dropout": 0.1}, {}),
    "gradient through the memory": ({"mem_bptt": 2}, {}),
    "documents": ({}, {"docs": True}),
    "key/value memory (evaluation)": ({}, {"kv": True, "train": False}),
}


def syncs_of(settings: dict, kv=False, train=True, docs=False) -> list[str]:
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**BASE, **settings})).train(train)
    ids = torch.randint(0, 50, (2, 33))
    extra = {"doc_ids": torch.zeros(2, 32, dtype=torch.long)} if docs else {}
    memory = model(ids[:, :32], Memory.empty("kv") if kv else None, **extra).mems  # a full memory
    with HostSyncs() as syncs:
        out = model(ids[:, :32], memory, ids[:, 1:], **extra)
        if train:
            out.loss.backward()
    return syncs.where


@pytest.mark.parametrize("name", list(CASES))
def test_a_forward_and_backward_read_nothing_back_from_the_device(name):
    settings, call = CASES[name]
    assert syncs_of(settings, **call) == []


def test_the_counter_sees_what_a_gpu_would_wait_on():
    """The claim above can fail: each kind of read is counted."""
    x = torch.arange(6.0)
    with HostSyncs() as syncs:
        int(x.max()), x[x > 2], x.nonzero(), x.tolist(), bool((x > 1).any())
    kinds = [w.split(" at ")[0] for w in syncs.where]
    assert kinds == ["_local_scalar_dense", "boolean indexing", "nonzero", "Tensor.tolist", "_local_scalar_dense"]


def test_known_reads_are_the_documented_ones():
    """Two inputs are data the model must see on the host, each read once per forward: a user's ``global_mask``
    (the sparse kernel lays its global columns out by it; the first ``num_global`` tokens need no read) and the
    document starts of the rnn mixer (PyTorch's LSTM cannot reset inside a sequence, so the run is cut there)."""
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**BASE, "attention": ["global"], "window": 4}))
    ids = torch.randint(0, 50, (2, 32))
    mask = torch.zeros(2, 32, dtype=torch.bool).index_fill_(1, torch.tensor([3]), True)
    with HostSyncs() as syncs:
        model(ids, global_mask=mask)
    assert [w.split(" at ")[0] for w in syncs.where] == ["Tensor.tolist"]
    rnn = syncs_of({"mixer": ["rnn"], "n_layer": 1}, docs=True)
    assert len(rnn) == 2 and all("rnn.py" in w for w in rnn)


def test_a_training_step_reads_the_device_once(tmp_path):
    """The trainer's bookkeeping and the NaN guard read the step's loss and gradient norm together, once; the
    tasks keep their losses on the device (they read one value per segment before)."""
    from longseq.config import DataConfig, RunConfig, TrainConfig
    from longseq.data import CharTokenizer, Corpus
    from longseq.tasks.lm import LanguageModeling
    from longseq.train.trainer import Trainer

    text = "abcab cabba bacca " * 100
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    corpus = Corpus(ids[:1400], ids[1400:1600], ids[1600:], tok, "generated")
    run = RunConfig(
        ModelConfig(vocab_size=4, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=8),
        DataConfig(tgt_len=8, batch_size=4, eval_batch_size=2, eval_tgt_len=8),
        TrainConfig(max_steps=3, grad_accum=2),
    )
    trainer = Trainer(LanguageModeling(run, corpus=corpus), run, str(tmp_path / "run"), progress=False)
    trainer.dir.open()
    try:
        trainer.build()
        trainer.step()  # the memory fills
        with HostSyncs() as syncs:
            assert trainer.step()
    finally:
        trainer.dir.close()
    assert len(syncs.where) == 1 and "Tensor.tolist" in syncs.where[0], syncs.where
