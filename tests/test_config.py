"""Configs: typed sections with strict keys, ``--set`` overrides (flat tails and dotted paths), TOML and JSON run
files (the TOML writer read back by tomllib), presets as shipped files, the registries' names, and the checks a
run's settings meet before anything is trained (options no chosen implementation reads, sizes that do not fit the
vocabulary, non-finite numbers).  A run reproduced from its own run.toml gives identical losses."""

import dataclasses
import json
import math
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longseq import DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.api import train
from longseq.config import PRESETS, ConfigError, get_preset, load_run_config, write_run_config
from longseq.config.files import dumps_toml, preset_names
from longseq.config.model import BIDIRECTIONAL_MIXERS

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


from support import TINY_CLI, TINY_CLI_8, assert_names, raises_naming, tiny_corpus, tiny_run, word_corpus

from longseq.cli import main
from longseq.config import apply_overrides
from longseq.model import build_model
from longseq.model.attention.kernels import ATTENTION_KERNELS
from longseq.model.attention.patterns import PATTERNS
from longseq.model.boundaries import BOUNDARY_PREDICTORS
from longseq.model.memory.compress import COMPRESSION_FUNCTIONS
from longseq.model.mixers import MIXERS
from longseq.model.positions import POSITION_ENCODINGS
from longseq.train import load_checkpoint

KEYS = st.text(min_size=1, max_size=12)
SCALARS = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text()  # quotes, backslashes, control characters and any unicode
)
VALUES = (
    SCALARS
    | st.lists(st.integers())
    | st.lists(st.booleans())
    | st.lists(st.text())
    | st.lists(st.floats(allow_nan=False))
)
TABLES = st.recursive(
    st.dictionaries(KEYS, VALUES, max_size=5), lambda t: st.dictionaries(KEYS, VALUES | t, max_size=4), max_leaves=20
)


@settings(max_examples=300, deadline=None)
@given(TABLES)
def test_the_toml_writer_is_read_back_exactly_by_tomllib(table):
    assert tomllib.loads(dumps_toml(table, header="a header\nwith two lines")) == table


def test_the_toml_writer_leaves_out_none_and_writes_special_floats():
    text = dumps_toml({"a": None, "b": {"c": None, "d": float("inf"), "e": -0.0}, "f": float("nan")})
    back = tomllib.loads(text)
    assert "a" not in back and back["b"] == {"d": math.inf, "e": 0.0} and math.isnan(back["f"])
    assert math.copysign(1, back["b"]["e"]) == -1
    with pytest.raises(ConfigError, match="TOML cannot hold None"):
        dumps_toml({"x": [1, None]})


def varied_run() -> RunConfig:
    """Every kind of field: nested sections, lists of ints, bools and strings, an unset optional (d_embed), a set
    optional (tie_projs) and strings that need escapes."""
    return RunConfig(
        model=ModelConfig(
            vocab_size=300, n_layer=2, cutoffs=[40, 120], tie_projs=[False, True, True], attention=["window", "full"],
            dilation=[1, 2, 1, 2], mem_len=12, same_length=True, init_std=1e-5,
        ),
        data=DataConfig(path='dir with "quotes" \\ back\\slash, ünï 東京', tokenizer="bpe", vocab_size=4096),
        train=TrainConfig(max_steps=7, lr=2.5e-4, min_lr=0.0, clip=1e300),
    )  # fmt: skip


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_run_config_written_and_read_back_is_equal(tmp_path, suffix):
    run = varied_run()
    assert run.model.d_embed is None
    path = str(tmp_path / f"run{suffix}")
    write_run_config(run, path)
    assert load_run_config(path) == run
    assert load_run_config(path, base=get_preset("enwik8-base")) == run  # the file sets every field but d_embed
    if suffix == ".toml":
        with open(path, "rb") as f:
            assert "d_embed" not in tomllib.load(f)["model"]  # unset: left out, read back unset


def test_presets_are_shipped_files_that_round_trip(tmp_path):
    shipped = {"tiny-shakespeare", "enwik8-base", "text8-base", "wt103-base", "ptb", "llama-xl"}
    assert set(PRESETS) == set(preset_names()) == shipped
    for name in PRESETS:
        run = PRESETS[name]()
        assert run == get_preset(name) and run is not get_preset(name)
        write_run_config(run, str(tmp_path / f"{name}.toml"))
        assert load_run_config(str(tmp_path / f"{name}.toml")) == run
    text8, enwik8 = get_preset("text8-base"), get_preset("enwik8-base")  # text8-base names enwik8-base as its base
    assert (text8.data.tokenizer, enwik8.data.tokenizer) == ("char", "byte")  # what text8-base changes
    assert text8.model == enwik8.model and text8.train == enwik8.train  # the rest it inherits
    assert text8.model.vocab_size == 0  # taken from the tokenizer when training starts
    with raises_naming(ConfigError, "'wt-103'", "wt103-base"):
        get_preset("wt-103")


def write(tmp_path, text, name="run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_keys_are_those_of_set_as_tails_or_paths_in_their_section(tmp_path):
    path = write(tmp_path, 'preset = "tiny-shakespeare"\n[model]\nmem_len = 32\nn_layer = 3\n'
                 '[model.pattern]\nattention = ["window"]\n[train]\nmax_steps = 9\nlr = "1e-4"\n')  # fmt: skip
    run = load_run_config(path)
    base = get_preset("tiny-shakespeare")
    assert run.model.memory.mem_len == 32 and run.model.n_layer == 3 and run.model.pattern.attention == ["window"]
    assert run.train.max_steps == 9 and run.train.optim.lr == 1e-4 and run.data == base.data
    assert load_run_config(write(tmp_path, "[train]\nmax_steps = 9\n", "partial.toml")).model == ModelConfig()


@pytest.mark.parametrize(
    "text,words",
    [
        ("[model]\nmem_lenn = 3\n", ("run.toml", "[model]", "'mem_lenn'", "mem_len")),
        ("[train]\nmem_len = 3\n", ("[train]", "'mem_len'")),
        ("[modle]\nn_layer = 3\n", ("'modle'", "model")),
        ("[model]\nmem_len = 3\n[model.memory]\nmem_len = 4\n", ("model.memory.mem_len", "twice")),
        ("[model]\nn_layer = 0\n", ("n_layer", ">= 1")),
        ("[train]\nlr = true\n", ("lr", "number")),
        ("[model\n", ("run.toml", "TOML")),
        ('preset = "nope"\n', ("preset", "'nope'")),
        ("model = 3\n", ("[model]", "table")),
    ],
)
def test_bad_config_files_are_errors_naming_the_file(tmp_path, text, words):
    with raises_naming(ConfigError, *words):
        load_run_config(write(tmp_path, text))


def test_a_file_that_names_a_preset_cannot_take_another_base(tmp_path):
    with raises_naming(ConfigError, "'ptb'", "base"):
        load_run_config(write(tmp_path, 'preset = "ptb"\n'), base=get_preset("enwik8-base"))
    with pytest.raises(ConfigError, match=".toml or .json"):
        load_run_config(write(tmp_path, "", "run.yaml"))


def test_training_twice_from_the_same_config_file_gives_identical_losses(tmp_path):
    path = str(tmp_path / "tiny.toml")
    write_run_config(tiny_run(max_steps=6), path)
    corpus = tiny_corpus()
    a = train(load_run_config(path), str(tmp_path / "a"), corpus=corpus, progress=False)
    b = train(load_run_config(path), str(tmp_path / "b"), corpus=corpus, progress=False)
    assert len(a.losses) == 6 and a.losses == b.losses


def test_the_command_line_writes_run_toml_and_reruns_it_with_identical_losses(tmp_path, text_corpus, capsys):
    from longseq.cli import main

    data = str(text_corpus)
    tiny = ["--set", "max_steps=4", "eval_interval=2", "eval_max_segments=2", "n_layer=1", "d_model=16", "n_head=2",
            "d_head=8", "d_inner=32", "batch_size=2", "tgt_len=8", "eval_tgt_len=8", "eval_batch_size=2", "mem_len=8", "log_interval=1"]  # fmt: skip
    first, again = str(tmp_path / "first"), str(tmp_path / "again")
    assert main(["train", "--data", data, "--out", first, "--quiet", "--json", *tiny]) == 0
    assert main(["train", "--config", os.path.join(first, "run.toml"), "--out", again, "--quiet", "--json"]) == 0
    capsys.readouterr()
    assert load_run_config(os.path.join(again, "run.toml")) == load_run_config(os.path.join(first, "run.toml"))

    def losses(run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [r["loss"] for r in map(json.loads, f) if "loss" in r]

    assert len(losses(first)) == 4 and losses(first) == losses(again)
    for argv, message in [
        (["train", "--config", os.path.join(first, "run.toml"), "--out", first, "--resume"], "--resume continues"),
        (["train", "--config", str(tmp_path / "missing.toml")], "cannot read config file"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_configs_round_trip_and_reject_unknown_keys():
    for name in ("tiny-shakespeare", "enwik8-base", "text8-base", "wt103-base", "ptb"):
        run = get_preset(name)
        again = RunConfig.from_dict(json.loads(json.dumps(run.to_dict())))
        assert again == run
    with pytest.raises(ConfigError, match="unknown ModelConfig key"):
        ModelConfig.from_dict({"n_layers": 3})
    with pytest.raises(ConfigError, match="cutoffs"):
        ModelConfig(vocab_size=100, cutoffs=[50, 40])
    sections = apply_overrides(
        {"model": ModelConfig(), "data": DataConfig(), "train": TrainConfig()},
        ["cutoffs=10,20", "same_length=true", "model.dropout=0.3", "lr=1e-4", "d_embed=none"],
    )
    assert sections["model"].cutoffs == [10, 20] and sections["model"].memory.same_length is True
    assert sections["model"].dropout == 0.3 and sections["train"].optim.lr == 1e-4
    with pytest.raises(ConfigError, match="must be >= 1"):
        apply_overrides({"model": ModelConfig()}, ["n_layer=0"])
    for bad, words in (("weight_decay=-1", ("weight_decay", ">= 0")), ("beta1=1.5", ("beta1", "[0, 1)")),
                       ("beta2=1", ("beta2", "[0, 1)")), ("eps=0", ("eps", "> 0"))):  # fmt: skip
        with raises_naming(ConfigError, *words):  # accepted, or left to torch's message, before
            apply_overrides({"train": TrainConfig()}, [bad])


def test_old_flat_override_keys_and_dotted_section_keys_both_work():
    run = get_preset("tiny-shakespeare")
    sections = {"model": run.model, "data": run.data, "train": run.train}
    flat = apply_overrides(sections, ["mem_len=12", "attention=window", "pos=shaw", "cmem_len=2", "cmem_rate=2"])
    dotted = apply_overrides(
        sections,
        ["model.memory.mem_len=12", "pattern.attention=window", "positions.pos=shaw", "memory.cmem_len=2",
         "model.memory.cmem_rate=2"],
    )  # fmt: skip
    assert flat["model"] == dotted["model"]
    assert flat["model"].memory.mem_len == 12 and flat["model"].pattern.attention == ["window"]
    assert ModelConfig.from_dict(flat["model"].to_dict()) == flat["model"]  # nested JSON round trip


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def flat_fields(train: TrainConfig) -> dict:
    """Every field of a sectioned train config by its own name, as the flat TrainConfig held them."""
    out = {}
    for name, value in train.to_dict().items():
        out.update(value if isinstance(value, dict) else {name: value})
    return out


def test_a_run_stored_with_a_flat_train_section_loads_into_the_sections_with_the_same_values():
    """``tests/fixtures/flat_train`` holds a run.toml and a checkpoint's run (``run.json``) written by the code
    before the sections (``make_flat_train.py``): every one of the 41 fields flat under ``train``, none at its
    default.  Both load, each field in its section with the value it had; the sectioned run writes and reads back
    equal; and a config made from today's format flattened (the old layout) is the same config."""
    with open(os.path.join(FIXTURES, "flat_train", "run.json"), encoding="utf-8") as f:
        stored = json.load(f)
    flat = stored["train"]
    assert len(flat) == 41 and all(not isinstance(v, dict) for v in flat.values())
    from_json = RunConfig.from_dict(stored)
    from_toml = load_run_config(os.path.join(FIXTURES, "flat_train", "run.toml"))
    assert from_json == from_toml
    assert flat_fields(from_json.train) == flat
    assert from_json.train.optim.lr == 3e-4 and from_json.train.runtime.parallel == "fsdp"
    assert from_json.train.checkpoint.keep_last == 3 and from_json.train.curriculum.mem_len_warmup_frac == 0.25
    assert TrainConfig(**flat) == TrainConfig.from_dict(flat) == from_json.train  # the constructor takes them too
    assert RunConfig.from_dict(json.loads(json.dumps(from_json.to_dict()))) == from_json
    sectioned = TrainConfig(lr=5e-4, keep_last=2, device="cpu", sample_interval=10, mem_len_start=0)
    assert TrainConfig.from_dict(flat_fields(sectioned)) == sectioned


FLAT_TASKS = ("classify", "span", "mlm", "passkey")  # tests/fixtures/flat_task (make_flat_task.py)


@pytest.mark.parametrize("name", FLAT_TASKS)
def test_a_run_stored_with_the_flat_task_section_loads_into_its_tasks_options_with_the_same_values(name):
    """``tests/fixtures/flat_task`` holds, per task, a run.toml and a checkpoint's run (``NAME.json``) written by the
    code before each task had its own options class: all 25 fields of the flat ``TaskConfig``, every option the task
    reads off its default.  Both load as the task's options class with each of its fields as stored; the fields it
    has none of were at the flat defaults; a checkpoint's path (``config.stored.upgrade``) reads the same; today's form
    writes and reads back equal."""
    from longseq.config.files import apply_sections, default_run, read_config_file
    from longseq.config.stored import FLAT_TASK_DEFAULTS as FLAT_DEFAULTS
    from longseq.config.stored import FORMAT, Stored, upgrade
    from longseq.config.task import TASK_OPTIONS

    with open(os.path.join(FIXTURES, "flat_task", f"{name}.json"), encoding="utf-8") as f:
        stored = json.load(f)
    flat = stored["task"]
    assert len(flat) == 25 and set(flat) - {"name"} == set(FLAT_DEFAULTS)
    from_json = RunConfig.from_dict(stored)
    toml = os.path.join(FIXTURES, "flat_task", f"{name}.toml")
    from_toml = apply_sections(default_run(), read_config_file(toml), toml)
    assert from_json == from_toml == RunConfig.from_dict(upgrade(Stored(stored), FORMAT).run)
    if name == "passkey":  # a recall run's run.toml runs again with train --config
        assert load_run_config(toml) == from_json
    task = from_json.task
    assert type(task) is TASK_OPTIONS[name]
    own = task.to_dict()
    fields = {f.name: f for f in dataclasses.fields(type(task))}
    later = set(own) - set(flat)  # options added after the flat class (mlm's class_rates, span): their defaults
    assert all(own[k] == (f.default_factory() if callable(f.default_factory) else f.default)
               for k, f in fields.items() if k in later)  # fmt: skip
    own = {k: v for k, v in own.items() if k not in later}
    assert {k: flat[k] for k in own} == own
    assert all(flat[k] == FLAT_DEFAULTS[k] for k in set(flat) - set(own))
    assert all(own[k] != FLAT_DEFAULTS[k] for k in set(own) - {"name"})  # the fixture set every option it reads
    assert RunConfig.from_dict(json.loads(json.dumps(from_json.to_dict()))) == from_json


def test_a_flat_task_table_that_set_an_option_its_task_does_not_read_is_refused_by_name():
    """The flat class refused such a table when the run started; the stored form is refused when it is read.  Only
    a table of the flat class's layout (all its keys) has the other tasks' defaults dropped."""
    with open(os.path.join(FIXTURES, "flat_task", "span.json"), encoding="utf-8") as f:
        stored = json.load(f)
    stored["task"]["pooling"] = "mean"
    with raises_naming(ConfigError, "task.pooling", "classify", "not of span"):
        RunConfig.from_dict(stored)
    partial = {"name": "span", "train": "x.jsonl", "pooling": "document"}  # not the flat class's: no field, refused
    with raises_naming(ConfigError, "task.pooling", "classify", "not of span"):
        RunConfig.from_dict({**stored, "task": partial})


def test_each_task_owns_its_options_and_nothing_else():
    """Every task's ``Options`` is the class its name gives; the fine-tuning tasks share the 11 common options and
    add their own (clm none); the recall tasks hold their 9; language modeling none."""
    from longseq.config.task import TASK_OPTIONS, FinetuneOptions, TaskConfig
    from longseq.tasks import TASKS

    assert set(TASKS) == set(TASK_OPTIONS) == set(TaskConfig.VARIANTS)
    assert all(task.Options is TASK_OPTIONS[name] for name, task in TASKS.items())
    common = ["name", "train", "valid", "segment_len", "base", "head_only", "group_by_length", "sha256"]
    common += ["lora_rank", "lora_alpha", "lora_dropout", "lora_targets"]
    options = {name: [f.name for f in dataclasses.fields(TASK_OPTIONS[name])] for name in TASKS}
    assert [f.name for f in dataclasses.fields(FinetuneOptions)] == common
    assert options["classify"] == [*common, "labels", "pooling", "lm_weight", "text_column", "label_column"]
    assert options["span"] == [*common, "max_answer_len"]
    assert options["mlm"] == [*common, "mask_rate", "mask_token", "mask_id", "text_column", "class_rates", "span"]
    recall = ["name", "segment_len", "seq_len", "min_distance", "max_distance", "key_len", "alphabet", "n_pairs",
              "n_copy", "valid_size"]  # fmt: skip
    assert all(options[name] == recall for name in ("passkey", "mqar", "copying", "induction"))
    assert options["lm"] == options["clm"][:1] == ["name"] and options["clm"] == common


def test_an_option_the_task_does_not_read_has_no_field_and_each_way_of_setting_it_names_it(tmp_path, capsys):
    """``pooling`` is classify's: set for span or passkey by the constructor, ``from_dict``, ``replace``, ``--set``
    (its name, ``task.pooling``), a config file's ``[task]`` table or the command line, it is an unknown key and the
    error names the option and the task that reads it.  Set for classify each way reaches the same field."""
    from longseq.config import TaskConfig

    span = TaskConfig(name="span", train="x.jsonl")
    words = ("task.pooling", "classify", "not of span")
    with raises_naming(ConfigError, *words):
        TaskConfig(name="span", train="x.jsonl", pooling="mean")
    with raises_naming(ConfigError, *words):
        TaskConfig.from_dict({"name": "span", "train": "x.jsonl", "pooling": "mean"})
    with raises_naming(ConfigError, *words):
        span.replace(pooling="mean")
    run = RunConfig(ModelConfig(), DataConfig(), TrainConfig(), span)
    for key in ("pooling", "task.pooling"):
        with raises_naming(ConfigError, *words):
            apply_overrides(run.sections(), [f"{key}=mean"])
    classify = run.sections() | {"task": TaskConfig(name="classify", train="x.jsonl")}
    for key in ("pooling", "task.pooling"):
        assert apply_overrides(classify, [f"{key}=mean"])["task"].pooling == "mean"
    (tmp_path / "passkey.toml").write_text('[task]\nname = "passkey"\npooling = "mean"\n')
    with raises_naming(ConfigError, "passkey.toml", "task.pooling", "not of passkey"):
        load_run_config(str(tmp_path / "passkey.toml"))
    argv = ["train", "--task", "passkey", "--out", str(tmp_path / "run"), "--set", "pooling=mean", "max_steps=1"]
    assert main(argv) == 2
    assert_names(capsys.readouterr().err, "pooling", "classify", "passkey")
    assert not (tmp_path / "run").exists()


def test_a_train_key_is_set_by_its_name_its_section_or_its_full_path(tmp_path, text_corpus):
    """``--set lr=``, ``optim.lr=``, ``train.lr=`` and ``train.optim.lr=`` set the same field, in the Python API and on
    the command line (the run.toml a run writes records it); a key of one section is not another's."""
    run = get_preset("tiny-shakespeare")
    for key in ("lr", "optim.lr", "train.lr", "train.optim.lr"):
        assert apply_overrides(run.sections(), [f"{key}=0.0005"])["train"].optim.lr == 0.0005, key
    for key in ("keep_last", "checkpoint.keep_last", "train.keep_last"):
        assert apply_overrides(run.sections(), [f"{key}=4"])["train"].checkpoint.keep_last == 4, key
    with raises_naming(ConfigError, "runtime.lr"):
        apply_overrides(run.sections(), ["runtime.lr=0.1"])
    for key, out in (("lr", "flat"), ("optim.lr", "section")):
        argv = ["train", "--data", str(text_corpus), *TINY_CLI, "--out", str(tmp_path / out), "--set", f"{key}=3e-4",
                "max_steps=1"]  # fmt: skip
        assert main(argv) == 0
        with open(tmp_path / out / "run.toml", "rb") as f:
            assert tomllib.load(f)["train"]["optim"]["lr"] == 3e-4


@pytest.mark.parametrize(
    "field, registry",
    [("attention", lambda: PATTERNS), ("attn_impl", lambda: ATTENTION_KERNELS), ("pos", lambda: POSITION_ENCODINGS),
     ("mixer", lambda: MIXERS), ("cmem_fn", lambda: COMPRESSION_FUNCTIONS),
     ("boundaries", lambda: BOUNDARY_PREDICTORS)],
)  # fmt: skip
def test_a_config_may_name_what_a_registry_implements_and_nothing_else(field, registry):
    """The registries own the names: every registered name builds a model, an unknown one is refused by name at
    build time with the close matches (no list of names is kept anywhere else)."""
    base = dict(vocab_size=12, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=4)
    extra = {"cmem_fn": dict(cmem_len=2, cmem_rate=2), "attention": dict(window=3),
             "boundaries": dict(n_layer=3, shorten_layers=[1, 2])}.get(field, {})  # fmt: skip
    for name in registry():
        value = [name] if field in ("attention", "mixer") else name
        if name == "flex":
            continue  # a CUDA kernel (and PyTorch's eager path on CPU): test_flex holds it to the reference
        own = {
            "absolute": {"mem_len": 0},
            **dict.fromkeys(BIDIRECTIONAL_MIXERS, {"bidirectional": True, "head_dim": 8}),
        }
        config = ModelConfig(**{**base, **extra, field: value, **own.get(name, {})})
        build_model(config)
    wrong = ["windw"] if field in ("attention", "mixer") else "windw"
    with pytest.raises(ConfigError, match=r"unknown value 'windw'"):
        build_model(ModelConfig(**{**base, **extra, field: wrong}))


def test_options_the_architecture_does_not_read_are_refused(tmp_path, text_corpus, capsys):
    """arch=lstm with cmem_len, attention=window and pos=shaw trained a plain LSTM while the log claimed an
    effective range of 96."""
    base = ["train", "--data", str(text_corpus), "--tokenizer", "char", "--out", str(tmp_path / "r"), *TINY_CLI_8]
    assert main([*base, "arch=lstm", "cmem_len=4", "cmem_rate=2", "attention=window", "pos=shaw"]) == 2
    err = capsys.readouterr().err
    for name in ("memory.cmem_len=4", "pattern.attention=window", "positions.pos=shaw", "n_head=2", "d_head=8"):
        assert name in err
    assert not (tmp_path / "r").exists()
    for setting, name in (["window=32", "pattern.window=32"], ["d_state=8", "mixers.d_state=8"],
                          ["max_relative_distance=9", "positions.max_relative_distance=9"]):  # fmt: skip
        assert main([*base, setting]) == 2
        assert name in capsys.readouterr().err
    assert main([*base, "attention=window", "window=8"]) == 0  # read (and narrower than memory + segment): accepted
    assert main(["train", "--data", str(text_corpus), "--tokenizer", "char", "--out", str(tmp_path / "lstm"),
                 "--quiet", "--set", "arch=lstm", "max_steps=2", "eval_interval=2"]) == 0  # the preset's own: fine  # fmt: skip


@pytest.mark.parametrize(
    "pattern, full",
    [(["attention=bigbird", "block_size=4", "num_random_blocks=2", "num_global=2"], True),  # the docs' line
     (["attention=bigbird", "window=4", "block_size=4", "num_random_blocks=2", "num_global=2"], False),
     (["attention=window", "window=16"], True), (["attention=window", "window=15"], False),
     (["attention=strided", "window=4", "stride=1"], True), (["attention=strided", "window=4", "stride=4"], False),
     (["attention=block_sparse", "block_size=16"], True), (["attention=block_sparse", "block_size=4"], False),
     (["attention=dilated", "window=16", "dilation=1"], True), (["attention=dilated", "window=16", "dilation=2"], False),
     (["attention=window,full", "n_layer=2", "window=32"], True)],
)  # fmt: skip
def test_a_pattern_that_allows_every_pair_at_the_runs_lengths_is_refused_at_start(tmp_path, text_corpus, capsys,
                                                                                pattern, full):  # fmt: skip
    """``attention=bigbird`` kept window=256, wider than segment plus memory, and trained exactly full attention (the
    same bpc to every digit); a pattern that allows every pair is now refused as an unread option is.  Segments of 8
    after a memory of 8: 16 keys."""
    import torch

    from longseq.cli.common import overrides
    from longseq.model.attention.patterns import layer_patterns
    from longseq.train.config_check import full_in_effect

    out = tmp_path / "r"
    argv = ["train", "--data", str(text_corpus), "--tokenizer", "char", "--out", str(out), *TINY_CLI_8, *pattern]
    assert main(argv) == (2 if full else 0)
    err = capsys.readouterr().err
    assert ("allows every pair" in err and "full attention" in err and "mem" in err) == full, err
    assert out.exists() != full
    run = RunConfig(**apply_overrides(get_preset("tiny-shakespeare").sections(), overrides([TINY_CLI_8[2:] + pattern])))
    # the claim itself, against the dense masks: full exactly when every causal pair of the 16 keys is allowed
    query, key = torch.arange(8, 16)[:, None], torch.arange(16)[None, :]
    dense = [p.allowed(query, key, 16) | (key > query) for p in layer_patterns(run.model) if p.name != "full"]
    assert all(bool(mask.all()) for mask in dense) == full == bool(full_in_effect(run))


def test_adaptive_softmax_cutoffs_are_checked_against_the_real_vocabulary(tmp_path, capsys):
    """From the default (character, 65-symbol) preset, a word corpus of about 300 symbols takes cutoffs 100,200."""
    data = word_corpus(tmp_path)
    args = ["train", "--data", data, "--tokenizer", "word", "--json", *TINY_CLI, "cutoffs=100,200"]
    assert main([*args, "--out", str(tmp_path / "ok")]) == 0
    _, tokenizer, run, _ = load_checkpoint(str(tmp_path / "ok" / "best"))
    assert run.model.vocab_size == tokenizer.vocab_size > 200 and run.model.cutoffs == [100, 200]
    assert main([*args[:-1], "cutoffs=100,400", "--out", str(tmp_path / "bad")]) == 2
    assert_names(capsys.readouterr().err, "cutoffs", "400", str(tokenizer.vocab_size))


def test_a_non_finite_setting_is_a_config_error(tmp_path, text_corpus, capsys):
    for setting in ("lr=inf", "lr=nan", "weight_decay=inf", "init_std=nan"):
        assert (
            main(
                [
                    "train",
                    "--data",
                    str(text_corpus),
                    "--out",
                    str(tmp_path / "r"),
                    "--tokenizer",
                    "char",
                    *TINY_CLI_8,
                    setting,
                ]
            )
            == 2
        )
        assert "finite number" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_evaluation_segment_follows_a_changed_training_segment(tmp_path, text_corpus, capsys):
    """Training with ``--set tgt_len=32`` validated on the preset's eval_tgt_len (64), and no command line said so;
    it now follows tgt_len unless set, is said, and the checkpoint keeps it (``longseq eval`` reads it)."""
    settings = [s for s in TINY_CLI if not s.startswith(("tgt_len", "eval_tgt_len"))]
    args = ["train", "--json", "--data", str(text_corpus), "--tokenizer", "char", *settings, "tgt_len=12"]
    assert main([*args, "--out", str(tmp_path / "follows")]) == 0
    assert "tgt_len=12: eval_tgt_len follows it (was 64" in capsys.readouterr().err
    assert load_run_config(str(tmp_path / "follows" / "run.toml")).data.eval_tgt_len == 12
    assert main([*args, "eval_tgt_len=20", "--out", str(tmp_path / "chosen")]) == 0
    assert "eval_tgt_len follows" not in capsys.readouterr().err
    assert load_run_config(str(tmp_path / "chosen" / "run.toml")).data.eval_tgt_len == 20
    run = tiny_run(max_steps=2, eval_interval=2)
    run = RunConfig(run.model, run.data.replace(tgt_len=12, eval_tgt_len=64), run.train)
    with pytest.warns(UserWarning, match="tgt_len=12 but eval_tgt_len=64"):  # the Python API: said, not changed
        train(run, str(tmp_path / "api"), corpus=tiny_corpus(), progress=False)


def test_one_config_file_serves_every_mixer_and_what_the_architecture_ignores_is_said(tmp_path, text_corpus, capsys):
    """A file that set n_head=2 was refused for ``--set mixer=ssm`` (which reads no heads) while the same fields at
    their defaults passed: a sweep over mixers needed one file each.  What the file sets is now accepted and
    named; what the command line sets for an architecture that ignores it is still refused."""
    (tmp_path / "tiny.toml").write_text("[model]\nn_layer = 1\nd_model = 16\nn_head = 2\nd_head = 8\nd_inner = 32\n"
                                        "[data]\ntgt_len = 8\neval_tgt_len = 8\nbatch_size = 2\n"
                                        "[train]\nmax_steps = 1\neval_interval = 1\neval_max_segments = 1\n")  # fmt: skip
    base = ["train", "--config", str(tmp_path / "tiny.toml"), "--data", str(text_corpus), "--tokenizer", "char",
            "--quiet"]  # fmt: skip
    for mixer in ("attention", "ssm", "conv"):
        assert main([*base, "--out", str(tmp_path / mixer), "--set", f"mixer={mixer}"]) == 0, mixer
        err = capsys.readouterr().err
        assert ("does not read n_head=2, d_head=8, set by the config file: ignored" in err) == (mixer != "attention")
    assert main([*base, "--out", str(tmp_path / "x"), "--set", "mixer=ssm", "n_head=4"]) == 2
    assert_names(capsys.readouterr().err, "does not read n_head=4", "no effect")
    assert not (tmp_path / "x").exists()
