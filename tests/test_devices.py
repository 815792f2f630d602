"""The model's device, everywhere it matters on a GPU, checked on the CPU: collectives exchange tensors on the
process group's device (NCCL moves CUDA tensors only), and a resume or a NaN rollback puts the memory it reads
from a checkpoint (on the CPU) on the model's device.  PyTorch's ``meta`` device stands in for a GPU: a tensor
left on the CPU is then told apart."""

from __future__ import annotations

import torch
import torch.distributed as dist

from longseq.config import ModelConfig
from longseq.model import Memory, TransformerXLLM
from longseq.train.distributed import World


def test_every_collective_gets_tensors_on_the_worlds_device(monkeypatch):
    seen = []

    def spy(tensor_or_list, *args, **kwargs):
        tensors = tensor_or_list if isinstance(tensor_or_list, list) else [tensor_or_list]
        seen.extend(t.device for t in tensors)

    for name in ("all_reduce", "all_gather"):
        monkeypatch.setattr(dist, name, lambda out, *args, _spy=spy, **kwargs: _spy(out) or _spy(list(args[:1])))
    for device in ("meta", "cpu"):
        world = World(rank=0, size=2, device=torch.device(device))
        seen.clear()
        for collective in (lambda w=world: w.mean(1.5), lambda w=world: w.any(True)):
            try:
                collective()
            except RuntimeError:  # the result of a meta tensor cannot be read: only what was handed over counts
                pass
        memory = TransformerXLLM(ModelConfig(vocab_size=9, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=8,
                                             mem_len=3))(torch.randint(0, 9, (2, 4))).mems  # fmt: skip
        try:
            world.gather_memory(memory)
        except Exception:  # the spy gathers nothing back: only what was handed over is checked
            pass
        assert seen and all(d.type == device for d in seen), (device, seen)


def test_a_restored_memory_is_on_the_models_device(tmp_path):
    """Resume and the NaN rollback both go through Trainer.restore: the memory read from the checkpoint lands on
    the trainer's device (here ``meta``), every tensor of it."""
    from longseq.config import DataConfig, RunConfig, TrainConfig
    from longseq.data import CharTokenizer, Corpus
    from longseq.tasks.lm import LanguageModeling
    from longseq.train.checkpoint import load_training_state
    from longseq.train.trainer import Trainer, train

    text = "abcab cabba bacca " * 100
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    corpus = Corpus(ids[:1400], ids[1400:1600], ids[1600:], tok, "generated")
    run = RunConfig(ModelConfig(vocab_size=4, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=8, mem_len=4,
                                mixer=["attention", "ssm"], head_dim=4),
                    DataConfig(tgt_len=4, batch_size=2, eval_batch_size=2, eval_tgt_len=4),
                    TrainConfig(max_steps=3, eval_interval=3, device="cpu"))  # fmt: skip
    train(run, str(tmp_path / "run"), corpus=corpus, progress=False)
    state = load_training_state(str(tmp_path / "run" / "last"))
    assert state.memory is not None and all(t.device.type == "cpu" for layer in state.memory.layers
                                            for t in layer.tensors())  # fmt: skip
    trainer = Trainer(LanguageModeling(run, corpus=corpus), run, str(tmp_path / "run"), resume=True, progress=False)
    trainer.dir.open()
    try:
        trainer.build()
        trainer.device = torch.device("meta")
        trainer.restore(state)
    finally:
        trainer.dir.close()
    tensors = [t for layer in trainer.memory.layers for t in layer.tensors()]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert isinstance(trainer.memory, Memory)
