"""Task data: JSONL readers with line-numbered errors, and the ListOps generator of Long Range Arena.

ListOps (Nangia and Bowman, 2018; Tay et al., 2021): nested MAX, MIN, MED (median) and SM (sum modulo 10)
over digits, e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]`` = 9; the label is the value, 10 classes.  Trees are drawn as in
LRA's generator (an operator node with probability 0.25 below the maximum depth, else a digit; 2 to
``max_args`` arguments) and kept when their length lies in [``min_length``, ``max_length``].
"""

from __future__ import annotations

import json
import os
import random
import statistics

from longseq.outputs import check_output_directory

TASK_FIELDS = {
    "classify": {"text": str, "label": (str, int)},
    "span": {"context": str, "question": str, "answer_start": int, "answer_text": str},
    "mlm": {"text": str},
}

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
LISTOPS_VOCAB = ("<pad>", *OPERATORS, "]", *(str(d) for d in range(10)))


class TaskDataError(ValueError):
    """A task file that cannot be read; the message names the file, the line and the problem."""


def encode_field(tokenizer, record: dict, key: str, path: str, number: int):
    """``tokenizer.encode(record[key])``; text it cannot encode (an unseen character) is an error naming the file,
    the record and the field, not only the position inside the field."""
    from longseq.data.tokenizers import TokenizerError

    try:
        return tokenizer.encode(record[key])
    except TokenizerError as exc:
        raise TaskDataError(f"{path}: record {number}, field {key!r}: {exc}") from None


def read_jsonl(path: str, task: str, columns: dict[str, str] | None = None) -> list[dict]:
    """Every record of a task file for ``task``: JSON lines (a malformed line is an error naming its number), a
    parquet or arrow table read through ``datasets`` (:mod:`longseq.data.tables`; errors name the row), or a UCR
    time-series file (``.ts``, ``.tsv``: a record a series, its values the text and its class the label).
    ``columns`` maps a field of the task to the file's name for it (``{"text": "review", "label": "stars"}``);
    a missing one is an error naming the fields the record has.  A FASTA file (masked LM) gives a record a sequence:
    its ``text``."""
    if task not in TASK_FIELDS:
        raise TaskDataError(f"unknown task {task!r}; known: {', '.join(TASK_FIELDS)}")
    if not os.path.isfile(path):
        raise TaskDataError(f"{path}: no such file")
    columns = {key: (columns or {}).get(key, key) for key in TASK_FIELDS[task]}
    try:
        numbered, where = numbered_records(path, list(columns.values()))
    except ValueError as exc:
        raise TaskDataError(str(exc)) from None
    records = [_task_record(record, task, columns, where(number)) for number, record in numbered]
    if not records:
        raise TaskDataError(f"{path}: no records")
    return records


def numbered_records(path: str, names: list[str] | None):
    """(number, record) of every record of ``path`` (a table: its columns ``names``, None: all), and how an error
    names the place of record ``number``."""
    from longseq.data.readers import reader_for
    from longseq.data.tables import table_suffix

    if reader_for(path).name == "fasta":  # a document a record: its sequence as the text
        return fasta_records(path), lambda number: f"{path}, record {number}"
    if path.lower().endswith((".ts", ".tsv")):  # a UCR time-series file: a series and its class a line
        from longseq.data.readers.ucr import ucr_records

        return ucr_records(path), lambda number: f"{path}:{number}"
    if table_suffix(path) not in (".parquet", ".arrow"):
        return list(iter_jsonl(path)), lambda number: f"{path}:{number}"
    from longseq.data.tables import table_batches

    rows = [dict(zip(batch, values)) for batch in table_batches(path, names) for values in zip(*batch.values())]
    return list(enumerate(rows, 1)), lambda number: f"{path}, row {number}"


def fasta_records(path: str) -> list[tuple[int, dict]]:
    """(number, {"text": sequence, "id": the header's first word}) of every record of a FASTA file."""
    from longseq.data.readers.fasta import records

    with open(path, "rb") as f:
        return [
            (n, {"text": seq, "id": title.split()[0] if title else ""})
            for n, (title, seq) in enumerate(records(path, f), 1)
        ]


def _task_record(record, task: str, columns: dict[str, str], where: str) -> dict:
    """``record`` with the task's fields under their names (from ``columns``), each checked for its type."""
    if not isinstance(record, dict):
        raise TaskDataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key, kind in TASK_FIELDS[task].items():
        column = columns[key]
        if column not in record:
            named = repr(key) if column == key else f"{column!r} (the task's {key!r})"
            raise TaskDataError(
                f"{where}: missing field {named} for task {task}; the record has {', '.join(record) or 'no fields'}"
            )
        value = record[key] = record[column]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TaskDataError(f"{where}: field {column!r} has the wrong type {type(value).__name__}")
    if task == "span":
        start, answer = record["answer_start"], record["answer_text"]
        if record["context"][start : start + len(answer)] != answer:
            raise TaskDataError(f"{where}: answer_text is not found at answer_start {start}")
    return record


def iter_jsonl(path: str):
    """(line number, value) for every non-empty line of a JSONL file; a line that is not JSON is a
    ``ValueError`` naming the file and the line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path}:{number}: not valid UTF-8 (byte {exc.start + 1} of the line: {raw[exc.start : exc.start + 4]!r})"
                ) from None
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None


def write_jsonl(path: str, rows, ensure_ascii: bool = True) -> None:
    """One JSON object a line, written under a temporary name and renamed: the file is complete or untouched, never
    truncated by an error or an interruption."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=ensure_ascii) + "\n" for row in rows)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int):
    if depth < max_depth and rng.random() <= 0.25:
        args = [_tree(rng, depth + 1, max_depth, max_args) for _ in range(rng.randint(2, max_args))]
        return (rng.choice(OPERATORS), args)
    return rng.randrange(10)


def listops_tokens(tree) -> list[str]:
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    return [op, *(t for a in args for t in listops_tokens(a)), "]"]


def listops_value(tree) -> int:
    if isinstance(tree, int):
        return tree
    op, args = tree
    values = [listops_value(a) for a in args]
    if op == "[MAX":
        return max(values)
    if op == "[MIN":
        return min(values)
    if op == "[MED":
        return int(statistics.median(values))
    return sum(values) % 10


def generate_listops(
    n: int, seed: int, *, min_length: int = 500, max_length: int = 2000, max_depth: int = 10, max_args: int = 10
) -> list[dict]:
    """``n`` examples ``{"text": "[MAX 2 9 ... ]", "label": value}``, the same for the same seed."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
    rng = random.Random(seed)
    examples = []
    while len(examples) < n:
        tree = _tree(rng, 1, max_depth, max_args)
        tokens = listops_tokens(tree)
        if min_length <= len(tokens) <= max_length:
            examples.append({"text": " ".join(tokens), "label": listops_value(tree)})
    return examples


def is_listops(path: str) -> bool:
    """Whether ``path`` holds ListOps examples as :func:`write_listops` writes them (its first row a ListOps
    expression and its value): the only file ``data listops`` replaces."""
    try:
        with open(path, encoding="utf-8") as f:
            row = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    text = row.get("text") if isinstance(row, dict) else None
    return isinstance(text, str) and text.startswith(OPERATORS) and row.get("label") in range(10)


def write_listops(out_dir: str, seed: int, sizes: dict[str, int], **lengths) -> dict[str, int]:
    """Write train/valid/test JSONL files of ListOps examples (distinct seeds per split).  Every split is drawn
    before anything is written and each file is written under a temporary name, then renamed: a bad argument or an
    interruption never leaves an existing file truncated."""
    for split, n in sizes.items():
        if n < 1:
            raise ValueError(f"--{split} must be >= 1 example, got {n}")
    check_output_directory(out_dir, "--out", "ListOps data", {f"{split}.jsonl": is_listops for split in sizes})
    examples = {split: generate_listops(n, seed * 1000 + i, **lengths) for i, (split, n) in enumerate(sizes.items())}
    os.makedirs(out_dir, exist_ok=True)
    for split, rows in examples.items():
        write_jsonl(os.path.join(out_dir, f"{split}.jsonl"), rows)
    return dict(sizes)
