"""``longseq predict``: a fine-tuned checkpoint's predictions for every line of a JSONL file (or every row of a
parquet or arrow table, read through ``datasets``; the run's ``task.text_column`` and ``task.label_column`` name its
fields).

One output line per input line, with the field ``prediction`` (classify: the label; span: the answer text; mlm: the
text with its [MASK] tokens filled) plus scores.  Where the input has the gold field (``label``, ``answer_text``),
the result also reports the metric, which reproduces what fine-tuning reported on the same file.
"""

from __future__ import annotations

import argparse
import os

from longseq.cli.common import checkpoint_kind, common_flags, device_flag, load_model, say


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("predict", help="predictions of a fine-tuned checkpoint for a JSONL file")
    p.add_argument("--checkpoint", required=True, help="a fine-tuned checkpoint, or its run directory (uses best/)")
    p.add_argument(
        "--data",
        required=True,
        help="input JSON lines (or a parquet/arrow table): the fields the task reads (text; question, context)",
    )
    p.add_argument("--out", required=True, help="output JSONL, one line per input line")
    device_flag(p)
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.config.task import FINETUNE_TASKS
    from longseq.data.tasks import write_jsonl
    from longseq.tasks import task_for

    check_output(args.out, args.data)  # before any work
    path, model, tokenizer, run_config = load_model(args.checkpoint, args.device)
    if run_config.task is None or run_config.task.name not in FINETUNE_TASKS:  # before the data is read
        raise ValueError(f"{path} has no predictions to give: it is {checkpoint_kind(run_config)}")
    task = task_for(run_config, tokenizer)
    check = lambda located: task.check_gold(located, args.data, path)  # noqa: E731
    records = read_records(args.data, task_columns(run_config.task), check)
    check_output(args.out, args.data)
    outputs = task.predict(model, records, args.data)
    write_jsonl(args.out, outputs, ensure_ascii=False)
    result = {"checkpoint": path, "task": run_config.task.name, "predictions": len(outputs), "out": args.out}
    gold_field = task.gold_field
    scored = [i for i, r in enumerate(records) if gold_field is not None and gold_field in r]
    if not scored:
        return result
    if len(scored) < len(records):
        say(
            f"{len(scored)} of the {len(records)} records of {args.data} have the gold field {gold_field!r}: the "
            f"metrics score those {len(scored)}"
        )
    result["scored"] = len(scored)
    result.update(task.score_predictions([records[i] for i in scored], [outputs[i] for i in scored]))
    return result


def task_columns(options) -> dict[str, str]:
    """The file's names of the task's fields (``task.text_column``, ``task.label_column``), where they differ."""
    names = {"text": getattr(options, "text_column", "text"), "label": getattr(options, "label_column", "label")}
    return {field: column for field, column in names.items() if field != column}


def read_records(path: str, columns: dict[str, str] | None = None, check=None) -> list[dict]:
    """The records of ``path``: JSON objects one per non-empty line, or the rows of a parquet or arrow table;
    ``columns`` renames the file's columns to the task's fields (``{"text": "review"}``).  ``check`` is given every
    record with its place (``path:line``) once all are read (a task's :meth:`~longseq.tasks.base.Task.check_gold`:
    a gold answer it cannot score is refused by name, as fine-tuning reports it)."""
    from longseq.data.tasks import TaskDataError, numbered_records

    if not os.path.isfile(path):
        raise TaskDataError(f"{path}: no such file")
    try:
        numbered, where = numbered_records(path, None)
    except ValueError as exc:
        raise TaskDataError(str(exc)) from None
    if not numbered:
        raise TaskDataError(f"{path}: no records")
    for number, record in numbered:
        if not isinstance(record, dict):
            raise TaskDataError(f"{where(number)}: expected a JSON object, got {type(record).__name__}")
        for field, column in (columns or {}).items():
            if column in record:
                record[field] = record[column]
    if check is not None:
        check([(where(number), record) for number, record in numbered])
    return [record for _, record in numbered]


def check_output(out: str, data: str) -> None:
    """``--out`` must be a file path that is not the input (the predictions would replace the user's data), and
    new or earlier predictions (every row with a ``prediction``): nothing else is replaced."""
    from longseq.outputs import check_output_file, jsonl_rows_with

    if os.path.isdir(out):
        raise ValueError(f"--out {out} is a directory; give the path of the output JSONL file")
    if os.path.exists(out) and os.path.exists(data) and os.path.samefile(out, data):
        raise ValueError(
            f"--out {out} is the input file --data: the predictions would replace it; choose another --out"
        )
    check_output_file(out, "--out", "predictions file", jsonl_rows_with("prediction"))
