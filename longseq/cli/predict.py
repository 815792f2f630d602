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
    from longseq.tasks.classify import classification_metrics, label_name
    from longseq.tasks.span import span_metrics

    check_output(args.out, args.data)  # before any work
    path, model, tokenizer, run_config = load_model(args.checkpoint, args.device)
    if run_config.task is None or run_config.task.name not in FINETUNE_TASKS:  # before the data is read
        raise ValueError(f"{path} has no predictions to give: it is {checkpoint_kind(run_config)}")
    records = read_records(args.data, run_config.task.name, task_columns(run_config.task))
    check_output(args.out, args.data)
    if run_config.task.name == "classify":
        check_gold_labels(records, run_config.task.labels, args.data, path)
    task = task_for(run_config, tokenizer)
    outputs = task.predict(model, records, args.data)
    write_jsonl(args.out, outputs, ensure_ascii=False)
    result = {"checkpoint": path, "task": run_config.task.name, "predictions": len(outputs), "out": args.out}
    gold_field = {"classify": "label", "span": "answer_text"}.get(run_config.task.name)
    scored = [i for i, r in enumerate(records) if gold_field in r]
    if not scored:
        return result
    if len(scored) < len(records):
        say(
            f"{len(scored)} of the {len(records)} records of {args.data} have the gold field {gold_field!r}: the "
            f"metrics score those {len(scored)}"
        )
    result["scored"] = len(scored)
    if gold_field == "label":
        names = task.options.labels
        gold = [names.index(label_name(records[i]["label"])) for i in scored]
        result.update(classification_metrics([names.index(outputs[i]["prediction"]) for i in scored], gold, len(names)))
    else:
        gold = [records[i]["answer_text"] for i in scored]
        result.update(span_metrics([outputs[i]["prediction"] for i in scored], gold))
    return result


def task_columns(options) -> dict[str, str]:
    """The file's names of the task's fields (``task.text_column``, ``task.label_column``), where they differ."""
    names = {"text": getattr(options, "text_column", "text"), "label": getattr(options, "label_column", "label")}
    return {field: column for field, column in names.items() if field != column}


def read_records(path: str, task: str, columns: dict[str, str] | None = None) -> list[dict]:
    """The records of ``path``: JSON objects one per non-empty line, or the rows of a parquet or arrow table;
    ``columns`` renames the file's columns to the task's fields (``{"text": "review"}``).  A classification gold
    label of the wrong type is an error naming its line, as fine-tuning reports it (it would be scored as a wrong
    prediction)."""
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
        gold = record.get("label")
        if task == "classify" and "label" in record and (isinstance(gold, bool) or not isinstance(gold, (str, int))):
            raise TaskDataError(f"{where(number)}: field 'label' has the wrong type {type(gold).__name__}")
    return [record for _, record in numbered]


def check_gold_labels(records: list[dict], labels: list[str], data: str, checkpoint: str) -> None:
    """Gold labels the classifier does not know would be scored as wrong predictions (accuracy 0 against labels of
    another task): refused, naming them and the labels the model knows."""
    from longseq.data.tasks import TaskDataError
    from longseq.tasks.classify import label_name

    unknown = sorted({label_name(r["label"]) for r in records if "label" in r} - set(labels))
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise TaskDataError(
            f"{data} has gold labels the classifier {checkpoint} does not know ({shown}); it knows "
            f"{', '.join(repr(x) for x in labels)}: give data labelled for this model, or leave the labels out"
        )


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
