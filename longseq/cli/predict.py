"""``longseq predict``: a fine-tuned checkpoint's predictions for every line of a JSONL file.

One output line per input line, with the field ``prediction`` (classify: the label; span: the answer text; mlm: the
text with its [MASK] tokens filled) plus scores.  Where the input has the gold field (``label``, ``answer_text``),
the result also reports the metric, which reproduces what fine-tuning reported on the same file.
"""

from __future__ import annotations

import argparse
import os

from longseq.cli.common import common_flags, device_flag, load_model


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("predict", help="predictions of a fine-tuned checkpoint for a JSONL file")
    p.add_argument("--checkpoint", required=True, help="a fine-tuned checkpoint, or its run directory (uses best/)")
    p.add_argument("--data", required=True, help="input JSONL: the fields the task reads (text; question, context)")
    p.add_argument("--out", required=True, help="output JSONL, one line per input line")
    device_flag(p)
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.data.tasks import write_jsonl
    from longseq.tasks import task_for
    from longseq.tasks.classify import classification_metrics, label_name
    from longseq.tasks.span import span_metrics

    path, model, tokenizer, run_config = load_model(args.checkpoint, args.device)
    if run_config.task is None:
        raise ValueError(f"{path} is a language model, not a fine-tuned one; sample from it with longseq generate")
    records = read_records(args.data, run_config.task.name)
    check_output(args.out, args.data)
    task = task_for(run_config, tokenizer)
    outputs = task.predict(model, records, args.data)
    write_jsonl(args.out, outputs, ensure_ascii=False)
    result = {"checkpoint": path, "task": run_config.task.name, "predictions": len(outputs), "out": args.out}
    if run_config.task.name == "classify" and all("label" in r for r in records):
        names = task.options.labels
        gold = [names.index(label_name(r["label"])) if label_name(r["label"]) in names else -1 for r in records]
        predicted = [names.index(o["prediction"]) for o in outputs]
        result.update(classification_metrics(predicted, gold, len(names)))
    if run_config.task.name == "span" and all("answer_text" in r for r in records):
        result.update(span_metrics([o["prediction"] for o in outputs], [r["answer_text"] for r in records]))
    return result


def read_records(path: str, task: str) -> list[dict]:
    """The JSON objects of ``path``, one per non-empty line; a classification gold label of the wrong type is an
    error naming its line, as fine-tuning reports it (it would be scored as a wrong prediction)."""
    from longseq.data.tasks import TaskDataError, iter_jsonl

    if not os.path.isfile(path):
        raise TaskDataError(f"{path}: no such file")
    try:
        numbered = list(iter_jsonl(path))
    except ValueError as exc:
        raise TaskDataError(str(exc)) from None
    if not numbered:
        raise TaskDataError(f"{path}: no records")
    for number, record in numbered:
        if not isinstance(record, dict):
            raise TaskDataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        gold = record.get("label")
        if task == "classify" and "label" in record and (isinstance(gold, bool) or not isinstance(gold, (str, int))):
            raise TaskDataError(f"{path}:{number}: field 'label' has the wrong type {type(gold).__name__}")
    return [record for _, record in numbered]


def check_output(out: str, data: str) -> None:
    """``--out`` must be a file path that is not the input (the predictions would replace the user's data)."""
    if os.path.isdir(out):
        raise ValueError(f"--out {out} is a directory; give the path of the output JSONL file")
    if os.path.exists(out) and os.path.samefile(out, data):
        raise ValueError(
            f"--out {out} is the input file --data: the predictions would replace it; choose another --out"
        )
