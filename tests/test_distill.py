"""Knowledge distillation: the loss against the KL written out over the whole vocabulary, the teacher's cached top-k
against one whole pass of the teacher, a distill run with alpha 0 against plain language modeling (the same losses),
exact resume, a student that moves towards its teacher, and the refusals that name what is wrong."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support import raises_naming, tiny_corpus, tiny_run

from longseq.api import train
from longseq.config import ModelConfig, RunConfig, TaskConfig
from longseq.data import CharTokenizer
from longseq.model import TransformerXLLM
from longseq.tasks.distill import distillation_loss
from longseq.tasks.teacher import TeacherCache, TeacherCacheError, teacher_topk, write_teacher_cache


def full_kl(student_logits, teacher_logits, temperature):
    """KL(softmax(t / T) || softmax(s / T)) at every position, summed over the whole vocabulary by a loop."""
    out = torch.zeros(student_logits.shape[:2], dtype=torch.float64)
    for b in range(student_logits.size(0)):
        for t in range(student_logits.size(1)):
            p = torch.softmax(teacher_logits[b, t].double() / temperature, -1)
            q = torch.softmax(student_logits[b, t].double() / temperature, -1)
            out[b, t] = sum(float(p[i] * (math.log(p[i]) - math.log(q[i]))) for i in range(p.numel()))
    return out


def test_with_the_whole_vocabulary_the_loss_is_the_softened_kl_and_the_nll_mixed_by_alpha():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 7, dtype=torch.float64), torch.randn(2, 5, 7, dtype=torch.float64) * 3
    labels = torch.randint(0, 7, (2, 5))
    labels[0, 1] = -100
    values, ids = teacher.topk(7, dim=-1)
    for temperature, alpha in ((1.0, 1.0), (2.0, 0.5), (0.5, 0.0)):
        total, nll = distillation_loss(student, labels, ids, values, temperature, alpha)
        expected_nll = F.cross_entropy(student.flatten(0, 1), labels.flatten(), ignore_index=-100)
        kl = full_kl(student, teacher, temperature).mean() * temperature**2
        assert torch.allclose(nll.double(), expected_nll, atol=1e-6)
        assert math.isclose(float(total), float((1 - alpha) * expected_nll + alpha * kl), rel_tol=1e-5, abs_tol=1e-6)


def test_both_distributions_are_renormalised_on_the_top_k_and_positions_without_a_teacher_are_left_out():
    torch.manual_seed(1)
    student, teacher = torch.randn(1, 4, 9), torch.randn(1, 4, 9)
    values, ids = teacher.topk(3, dim=-1)
    ids[0, 2] = -1  # no teacher here
    total, _ = distillation_loss(student, torch.zeros(1, 4, dtype=torch.long), ids, values, 1.0, 1.0)
    kls = []
    for t in (0, 1, 3):
        p = torch.softmax(values[0, t], -1)
        q = torch.log_softmax(student[0, t][ids[0, t]], -1)  # the student on the teacher's top k, renormalised
        kls.append(float((p * (p.log() - q)).sum()))
    assert math.isclose(float(total), sum(kls) / 3, rel_tol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_a_student_equal_to_its_teacher_is_not_moved_by_the_top_k_kl(temperature):
    """A flat teacher (50 tokens, the top 8 holding a fraction of its mass): the KL of its own distribution is 0 with
    no gradient (float32 rounding).  Against the student's whole distribution (the form before) the loss was 1.18 at
    T = 1 and 5.93 at T = 2, its gradient's norm 0.080 and 0.17, pushing the student's mass onto the 8 tokens."""
    torch.manual_seed(0)
    teacher = torch.randn(2, 6, 50, dtype=torch.float64) * 0.5
    values, ids = teacher.topk(8, dim=-1)
    student = teacher.clone().requires_grad_(True)
    total, _ = distillation_loss(student, torch.zeros(2, 6, dtype=torch.long), ids, values, temperature, 1.0)
    (grad,) = torch.autograd.grad(total, student)
    assert abs(float(total)) < 1e-6 and float(grad.norm()) < 1e-6, (float(total), float(grad.norm()))  # float32


def test_the_cached_top_k_is_the_teachers_whole_pass_read_in_segments_with_its_memory():
    """With a memory that holds every earlier position, the teacher read in segments of 8 is its whole pass."""
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(vocab_size=11, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32,
                                        dropout=0.0, mem_len=64)).double()  # fmt: skip
    ids = np.random.default_rng(0).integers(0, 11, size=41)
    top_ids, top_logits = teacher_topk(model, ids, 4, batch_size=1, tgt_len=8)
    with torch.no_grad():
        whole = model.eval()(torch.as_tensor(ids[None, :-1]), recurrence=model.config.recurrence(mem_len=64)).logits[
            0
        ]  # predicts positions 1 .. 40
    values, where = whole.float().topk(4, dim=-1)
    assert (top_ids[0] == -1).all()  # no stream predicts the first position
    assert np.array_equal(top_ids[1:], where.numpy())
    assert np.allclose(top_logits[1:], values.numpy(), atol=1e-5)


def teacher_run(tmp_path):
    train(tiny_run(max_steps=3, eval_interval=3), str(tmp_path / "teacher"), corpus=tiny_corpus(), progress=False)
    return str(tmp_path / "teacher")


def distill_run(teacher: str, **options) -> RunConfig:
    run = tiny_run(max_steps=6, eval_interval=3)
    model = run.model.replace(n_layer=1, d_model=8, n_head=1, d_head=8, d_inner=16)
    return RunConfig(model, run.data, run.train, TaskConfig(name="distill", teacher=teacher, **{"top_k": 4, **options}))


def test_alpha_zero_trains_as_plain_language_modeling_within_rounding(tmp_path):
    teacher = teacher_run(tmp_path)
    student = distill_run(teacher, alpha=0.0)
    distilled = train(student, str(tmp_path / "distilled"), corpus=tiny_corpus(), progress=False)
    plain = train(RunConfig(student.model, student.data, student.train), str(tmp_path / "plain"),
                  corpus=tiny_corpus(), progress=False)  # fmt: skip
    assert distilled.losses == pytest.approx(plain.losses, rel=1e-5)  # the NLL summed in another order
    assert (tmp_path / "distilled" / "teacher-cache" / "topk.safetensors").is_file()


@pytest.mark.parametrize("online", [False, True])
def test_a_distill_run_resumes_exactly(tmp_path, online):
    teacher = teacher_run(tmp_path)
    corpus, options = tiny_corpus(), {"online": True, "context": 5} if online else {}
    whole = train(distill_run(teacher, **options), str(tmp_path / "whole"), corpus=corpus, progress=False)
    first = train(distill_run(teacher, **options), str(tmp_path / "split"), corpus=corpus, progress=False,
                  stop_after=2)  # fmt: skip
    second = train(distill_run(teacher, **options), str(tmp_path / "split"), corpus=corpus, progress=False,
                   resume=True)  # fmt: skip
    assert first.losses + second.losses == whole.losses
    assert (tmp_path / "whole" / "teacher-cache").exists() != online


def test_online_targets_are_the_teachers_pass_over_the_window_before_each_row(tmp_path):
    from longseq.tasks.distill import Distillation, Teacher
    from longseq.train.checkpoint import load_checkpoint

    teacher = teacher_run(tmp_path)
    model, tok, run, _ = load_checkpoint(teacher + "/best")
    corpus = tiny_corpus()
    student = distill_run(teacher, online=True, context=6, hidden_weight=1.0)
    student = RunConfig(run.model, student.data, student.train, student.task)  # the teacher's width
    task = Distillation(student, corpus=corpus, teacher=Teacher(teacher + "/best", model, tok, run))
    task.prepare()
    first = torch.tensor([3, 40, 200])  # the first row has 3 tokens before it, so every row reads 3
    ids, logits, hidden = task._online(first, 8, torch.device("cpu"))
    for row, a in enumerate(first.tolist()):
        layers = []
        with torch.no_grad():
            out = model.eval()(torch.as_tensor(corpus.train[None, a - 3 : a + 8]), layer_outputs=layers)
        values, where = out.logits[0, 3:].topk(4, dim=-1)
        assert torch.equal(ids[row], where) and torch.allclose(logits[row], values)
        assert torch.allclose(hidden[row], layers[-1][0, 3:])


def test_the_hidden_state_alignment_is_the_cosine_distance_and_needs_the_teacher_online_and_of_the_same_width(
    tmp_path,
):
    from longseq.tasks.distill import cosine_distance

    a, b = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    expected = sum(1 - float(a[i, j] @ b[i, j] / (a[i, j].norm() * b[i, j].norm())) for i in range(2) for j in range(3))
    assert math.isclose(float(cosine_distance(a, b)), expected / 6, rel_tol=1e-5)
    assert float(cosine_distance(a, 3 * a)) < 1e-6  # the scale does not count
    with raises_naming(Exception, "hidden_weight", "online=true"):
        TaskConfig(name="distill", teacher="t", hidden_weight=0.5)
    teacher = teacher_run(tmp_path)
    with raises_naming(Exception, "d_model", "8", "16"):
        train(distill_run(teacher, online=True, hidden_weight=0.5), str(tmp_path / "s"), corpus=tiny_corpus(),
              progress=False)  # fmt: skip


def kl_to_teacher(student_dir: str, teacher_dir: str) -> float:
    from longseq.train.checkpoint import load_checkpoint

    student, _, _, _ = load_checkpoint(student_dir)
    teacher, _, _, _ = load_checkpoint(teacher_dir)
    ids = torch.as_tensor(tiny_corpus().valid[None, :200])
    with torch.no_grad():
        s, t = student.eval()(ids).logits, teacher.eval()(ids).logits
    return float(F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean"))


def test_a_student_distilled_with_alpha_one_moves_towards_its_teacher_and_one_trained_on_the_text_does_not(tmp_path):
    """The teacher is a random function (init_std 0.2, not trained): only the distilled student can learn it."""
    run = tiny_run(max_steps=1, lr=1e-9, min_lr=0.0, warmup_steps=0)
    random = RunConfig(run.model.replace(init_std=0.2), run.data, run.train)
    train(random, str(tmp_path / "teacher"), corpus=tiny_corpus(), progress=False)
    teacher = str(tmp_path / "teacher" / "last")
    student = distill_run(teacher, alpha=1.0, temperature=1.0, top_k=10)
    student = RunConfig(student.model, student.data, student.train.replace(max_steps=40, lr=1e-2), student.task)
    train(student, str(tmp_path / "distilled"), corpus=tiny_corpus(), progress=False)
    train(RunConfig(student.model, student.data, student.train), str(tmp_path / "plain"), corpus=tiny_corpus(),
          progress=False)  # fmt: skip
    distilled = kl_to_teacher(str(tmp_path / "distilled" / "last"), teacher)
    plain = kl_to_teacher(str(tmp_path / "plain" / "last"), teacher)
    assert distilled < 0.8 * plain, (distilled, plain)


def test_a_teacher_of_another_tokenizer_and_a_cache_of_another_teacher_are_refused_by_name(tmp_path):
    from longseq.tasks.distill import Distillation, Teacher
    from longseq.train.checkpoint import load_checkpoint

    teacher = teacher_run(tmp_path)
    model, tok, run, _ = load_checkpoint(teacher + "/best")
    other = CharTokenizer(list("xyz "))
    task = Distillation(distill_run(teacher), other, corpus=tiny_corpus(), teacher=Teacher(teacher, model, tok, run))
    with raises_naming(Exception, "another tokenizer", teacher):
        task.prepare()
    ids = tiny_corpus().train
    top = np.zeros((len(ids), 2), dtype=np.int32), np.zeros((len(ids), 2), dtype=np.float32)
    cache = write_teacher_cache(str(tmp_path / "cache"), *top, teacher_sha256="abc", ids_sha256="def")
    with raises_naming(TeacherCacheError, "another teacher", "training split"):
        TeacherCache(cache, teacher_sha256="xyz", ids_sha256="uvw", tokens=len(ids), top_k=2)
    with raises_naming(TeacherCacheError, "top 2", "top_k=4"):
        TeacherCache(cache, teacher_sha256="abc", ids_sha256="def", tokens=len(ids), top_k=4)
    with raises_naming(TeacherCacheError, "already exists"):
        write_teacher_cache(cache, *top)


@pytest.mark.parametrize("alpha", [1.5, -0.1])
def test_distill_options_are_checked(alpha):
    with raises_naming(Exception, "task.alpha"):
        TaskConfig(name="distill", teacher="t", alpha=alpha)
