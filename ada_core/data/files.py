"""Dataset file readers: local parquet or jsonl in one of the paper's HF schemas, auto-detected from the
columns; every bad row fails with the file, the 1-based row and the field named.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ada_core.errors import DatasetError, DatasetMissingError
from ada_core.records import Prompt
from ada_core.rl.rewards import last_boxed


# ---------------------------------------------------------------------------------------------
# File loaders


@dataclass(frozen=True)
class FileSchema:
    """Where a dataset file keeps each piece of a prompt. The first present `text` column wins."""

    name: str
    text: tuple[str, ...]
    answer: str
    id: str | None
    meta: tuple[str, ...] = ()
    level: str | None = None
    """Column with the dataset's own difficulty level, copied to `prompt.difficulty`."""


# Column names from each dataset's HF card (see the docstring of `detect_schema`).
SCHEMAS: dict[str, FileSchema] = {
    "openr1": FileSchema("openr1", ("problem",), "answer", "uuid", ("problem_type", "question_type", "source")),
    "math500": FileSchema("math500", ("problem",), "answer", "unique_id", ("subject", "level"), level="level"),
    "minerva": FileSchema("minerva", ("question", "problem"), "answer", "idx", ("type",)),
    "olympiadbench": FileSchema(
        "olympiadbench", ("question",), "final_answer", "id",
        ("subfield", "answer_type", "unit", "is_multiple_answer"),
    ),
    "aime": FileSchema("aime", ("problem",), "answer", "id", ("url", "year")),
    "prompts": FileSchema("prompts", ("text",), "answer", "id", ("source",)),  # our own saved Prompts
}


def detect_schema(columns: set[str]) -> str:
    """The schema a file's columns belong to.

    - OpenR1-Math-220k: problem, solution, answer, problem_type, question_type, source, uuid, ...
    - MATH500: problem, solution, answer, subject, level, unique_id
    - Minerva Math: question, answer (math-ai/minervamath); or problem, solution with the answer
      boxed in the solution (Qwen2.5-Math eval files), answer then read from the last \\boxed{}
    - OlympiadBench: id, question, final_answer (a list), subfield, answer_type, unit, ...
    - AIME-style sets: problem, answer, id, (solution, url, year)
    - prompts: our own saved Prompt records (id, text, answer, source, difficulty, meta)
    """
    if "final_answer" in columns:
        return "olympiadbench"
    if "unique_id" in columns:
        return "math500"
    if columns & {"uuid", "problem_type", "question_type", "correctness_math_verify"}:
        return "openr1"
    if {"id", "text", "answer"} <= columns:
        return "prompts"
    if "question" in columns and "answer" in columns:
        return "minerva"
    if {"problem", "solution"} <= columns and "answer" not in columns:
        return "minerva"
    if {"problem", "answer"} <= columns:
        return "aime"
    raise DatasetError(
        f"cannot tell the dataset schema from columns {sorted(columns)}; pass schema= one of {sorted(SCHEMAS)}"
    )


def load_dataset_file(path: str | Path, schema: str | None = None, id_prefix: str | None = None) -> list[Prompt]:
    """Prompts from a local `.parquet` or `.jsonl` file in one of `SCHEMAS` (auto-detected if None).

    Prompt ids are `<id_prefix>/<row id>`, the prefix defaulting to the file's stem (our own saved
    prompts keep their ids as they are).

    A malformed row (missing or empty required field, wrong type, duplicate id) raises a
    ValueError naming the file, the 1-based row number and the field.

    Parquet goes through Hugging Face `datasets`: the file becomes a memory-mapped Arrow table
    and the row checks run as a batched `map`, both cached under ADA_HOME/cache/hf_datasets and
    keyed by fingerprint (the file's path, size and mtime; the schema; this code), so a second
    load of an unchanged file skips parsing and checking. jsonl rows are parsed line by line in
    Python, because Arrow's JSON reader would coerce mixed types (`4` and `4.5` both to floats)
    and could not name the line a bad row sits on.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetMissingError(f"dataset file {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as err:
            raise DatasetError(f"{path}: not a readable parquet file ({err})") from None
        if parquet.metadata.num_rows == 0:
            raise DatasetError(f"{path}: the file has no rows (it is empty or blank)")
        columns = set(parquet.schema_arrow.names)
        name = _schema_name(path, columns, schema)
        records = _parquet_records(path, name, columns, id_prefix or path.stem)  # ids checked: nothing cached if bad
    else:
        columns, rows = _read_rows(path)
        if not rows:
            raise DatasetError(f"{path}: the file has no rows (it is empty or blank)")
        name = _schema_name(path, columns, schema)
        boxed = _boxed_from_solution(SCHEMAS[name], columns)
        checked = [_record(name, SCHEMAS[name], row, n, path, boxed, id_prefix or path.stem) for n, row in rows]
        records = {key: [r[key] for r in checked] for key in RECORD_COLUMNS}
        _check_unique_ids(path, records, SCHEMAS[name].id or "id")
    if not records["id"]:
        raise DatasetError(f"{path}: no rows")
    meta_of = _meta_reader()
    return [Prompt(id=pid, text=text, answer=answer, source=source, difficulty=difficulty, meta=meta_of(meta))
            for pid, text, answer, source, difficulty, meta in zip(
                records["id"], records["text"], records["answer"], records["source"], records["difficulty"],
                records["meta"])]


RECORD_COLUMNS = ("row", "id", "raw_id", "text", "answer", "source", "difficulty", "meta")


def _meta_reader() -> Callable[[str], dict[str, Any]]:
    """json.loads for meta strings, parsing each distinct one once (rows mostly share a few) and
    handing every prompt its own copy."""
    parsed: dict[str, dict[str, Any]] = {}

    def read(text: str) -> dict[str, Any]:
        value = parsed.get(text)
        if value is None:
            value = parsed[text] = json.loads(text)
        if any(isinstance(v, (dict, list)) for v in value.values()):
            return copy.deepcopy(value)
        return dict(value)

    return read


def _schema_name(path: Path, columns: set[str], schema: str | None) -> str:
    if schema is None:
        try:
            return detect_schema(columns)
        except DatasetError:
            raise DatasetError(
                f"{path}: row 1: cannot tell the dataset schema from its fields {sorted(columns)}; a file needs a "
                f"problem field ({_schema_hint()}) and an answer field"
            ) from None
    if schema not in SCHEMAS:
        raise DatasetError(f"{path}: unknown schema {schema!r}; choose from {sorted(SCHEMAS)}")
    return schema


def _boxed_from_solution(spec: FileSchema, columns: set[str]) -> bool:
    return spec.answer not in columns and "solution" in columns


def _record(name: str, spec: FileSchema, row: Any, n: int, path: Path, boxed_from_solution: bool,
            prefix: str) -> dict[str, Any]:
    """One checked row as a flat record (`RECORD_COLUMNS`; meta as JSON), or a DatasetError naming row and field."""
    where = f"{path}: row {n}"
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    text_col = next((c for c in spec.text if c in row), spec.text[0])
    text = _required_str(row, text_col, where)
    if boxed_from_solution:
        answer = last_boxed(_required_str(row, "solution", where))
        if answer is None:
            raise DatasetError(f"{where}: field 'solution' has no \\boxed{{}} answer and there is no 'answer' field")
    else:
        answer = _answer(row, spec.answer, where)
    raw_id = row.get(spec.id) if spec.id else None
    if raw_id is None or raw_id == "":
        raw_id = n
    elif not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool):
        raise DatasetError(f"{where}: field '{spec.id}' must be a string or integer, got {type(raw_id).__name__}")
    pid = str(raw_id) if name == "prompts" else f"{prefix}/{raw_id}"
    prompt = _make_prompt(name, spec, row, pid, text, answer, path, where)
    return {"row": n, "id": pid, "raw_id": repr(raw_id), "text": prompt.text, "answer": prompt.answer,
            "source": prompt.source, "difficulty": prompt.difficulty, "meta": json.dumps(prompt.meta, default=str)}


def _check_unique_ids(path: Path, records: dict[str, list], id_field: str) -> None:
    first_row_of: dict[str, int] = {}
    for n, pid, raw in zip(records["row"], records["id"], records["raw_id"]):
        if pid in first_row_of:
            raise DatasetError(f"{path}: row {n}: field '{id_field}' repeats id {raw} of row {first_row_of[pid]}")
        first_row_of[pid] = n


def _record_batch(batch: dict[str, list], indices: list[int], name: str, path: str, boxed: bool,
                  prefix: str) -> dict[str, list]:
    """`datasets.map` body: check a batch of parquet rows (1-based row = index + 1) into records."""
    spec, where = SCHEMAS[name], Path(path)
    columns = list(batch)
    rows = [{c: batch[c][i] for c in columns} for i in range(len(indices))]
    out = [_record(name, spec, row, idx + 1, where, boxed, prefix) for row, idx in zip(rows, indices)]
    return {key: [r[key] for r in out] for key in RECORD_COLUMNS}


def _parquet_records(path: Path, name: str, columns: set[str], prefix: str) -> dict[str, list]:
    """The checked records of a parquet file; a bad row or a repeated id is refused with nothing left in
    the datasets cache under ADA_HOME (`hf.checked_parquet`)."""
    from ada_core.data.hf import RECORD_FEATURES, cached_map, checked_parquet

    # Read only what some schema uses: OpenR1's generations columns alone are gigabytes.
    wanted = {c for s in SCHEMAS.values() for c in (*s.text, s.answer, s.id, s.level, *s.meta) if c}
    wanted |= {"solution", "meta", "difficulty"}

    def check(table) -> dict[str, list]:
        records = cached_map(
            table, _record_batch, batched=True, batch_size=1000, with_indices=True,
            remove_columns=table.column_names, features=RECORD_FEATURES, desc=f"checking {path.name}",
            fn_kwargs={"name": name, "path": str(path), "boxed": _boxed_from_solution(SCHEMAS[name], columns),
                       "prefix": prefix},
        ).to_dict()
        _check_unique_ids(path, records, SCHEMAS[name].id or "id")
        return records

    return checked_parquet(path, sorted(columns & wanted), check)


def _schema_hint() -> str:
    return ", ".join(f"{'/'.join(spec.text)}+{spec.answer} ({name})" for name, spec in SCHEMAS.items())


def _make_prompt(name: str, spec: FileSchema, row: dict, pid: str, text: str, answer: str, path: Path,
                 where: str) -> Prompt:
    if name == "prompts":  # our own records round-trip with their source, difficulty and meta
        meta = row.get("meta") or {}
        if not isinstance(meta, dict):
            raise DatasetError(f"{where}: field 'meta' must be an object, got {type(meta).__name__}")
        difficulty = row.get("difficulty")
        if difficulty is not None and (isinstance(difficulty, bool) or not isinstance(difficulty, (int, float))):
            raise DatasetError(f"{where}: field 'difficulty' must be a number, got {type(difficulty).__name__}")
        meta.setdefault("answer_format", "boxed")
        return Prompt(id=pid, text=text, answer=answer, source=str(row.get("source") or ""),
                      difficulty=None if difficulty is None else float(difficulty), meta=meta)
    meta: dict[str, Any] = {"answer_format": "boxed", "file": path.name}
    meta.update({col: row[col] for col in spec.meta if row.get(col) is not None})
    level = row.get(spec.level) if spec.level else None
    difficulty = float(level) if isinstance(level, (int, float)) and not isinstance(level, bool) else None
    return Prompt(id=pid, text=text, answer=answer, source=name, difficulty=difficulty, meta=meta)


def _read_rows(path: Path) -> tuple[set[str], list[tuple[int, Any]]]:
    """All columns seen and `(1-based row number, row)` pairs of a jsonl file; rows are numbered by line."""
    if path.suffix == ".jsonl":
        rows, columns = [], set()
        with path.open("rb") as fh:
            for n, raw in enumerate(fh, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DatasetError(f"{path}: row {n}: {_bad_bytes_field(raw)} is not valid UTF-8 (byte "
                                       f"0x{raw[err.start]:02x} at byte {err.start} of the line)") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DatasetError(f"{path}: row {n}: not valid JSON ({err.msg})") from None
                if isinstance(row, dict):
                    columns |= set(row)
                rows.append((n, row))
        return columns, rows
    raise DatasetError(f"{path}: unsupported file type {path.suffix!r}; use .parquet or .jsonl")


def _bad_bytes_field(raw: bytes) -> str:
    """`field 'problem'`: which field of a JSON line holds the undecodable bytes, when the line parses."""
    # surrogateescape keeps each bad byte as a lone surrogate, so the line still parses as JSON.
    try:
        row = json.loads(raw.decode("utf-8", errors="surrogateescape"))
    except json.JSONDecodeError:
        return "the line"

    def bad(text: str) -> bool:
        return any("\udc80" <= ch <= "\udcff" for ch in text)

    def find(value: Any, name: str) -> str | None:
        if isinstance(value, str):
            return name if bad(value) else None
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, child in items:
            child_name = f"{name}.{key}" if name else str(key)
            if isinstance(key, str) and bad(key):
                return child_name
            found = find(child, child_name)
            if found:
                return found
        return None

    found = find(row, "")
    return f"field {found!r}" if found else "the line"


def _required_str(row: dict, field: str, where: str) -> str:
    value = row.get(field)
    if value is None:
        raise DatasetError(f"{where}: field '{field}' is missing")
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field '{field}' must be a string, got {type(value).__name__}")
    if not value.strip():
        raise DatasetError(f"{where}: field '{field}' is empty")
    return value.strip()


def _answer(row: dict, field: str, where: str) -> str:
    """A reference answer: a string, an integer (AIME copies store int64), or OlympiadBench's list."""
    value = row.get(field)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list):
        if not value:
            raise DatasetError(f"{where}: field '{field}' is an empty list")
        if not all(isinstance(v, str) and v.strip() for v in value):
            raise DatasetError(f"{where}: field '{field}' must hold non-empty strings")
        return ", ".join(v.strip() for v in value)  # several answers read as one tuple by math-verify
    return _required_str(row, field, where)
