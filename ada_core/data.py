"""Prompt sets: seeded generators, loaders for the paper's datasets, and the train/eval split.

Every prompt says how its answer is read from a completion in `meta["answer_format"]`:
`plain` (the completion IS the answer: the tiny model's `a+b=`) or `boxed` (the last `\\boxed{}`).

`load_prompts("arithmetic", 2048, seed=0)` generates; `load_prompts("chain_sum:2", ...)` generates
reasoning-gym's chain_sum at curriculum level 2; `load_prompts("data/math500.parquet", ...)` loads a
local parquet or jsonl file in one of the HF schemas below (auto-detected from its columns).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ada_core.config import InputError
from ada_core.records import Prompt
from ada_core.rewards import last_boxed



class DatasetError(InputError, ValueError):
    """A dataset cannot be used; the message names the file, the 1-based row and the field."""


class DatasetMissingError(InputError, FileNotFoundError):
    """A dataset file that does not exist."""


# ---------------------------------------------------------------------------------------------
# Generators


def arithmetic_prompts(size: int, seed: int, difficulty: int | None = None) -> list[Prompt]:
    """`size` distinct `a+b=` problems; operands have 1..difficulty digits (default 3).

    Each operand draws its digit count uniformly, then a value with that many digits (0-9 for one
    digit), so short and long operands are equally common. `prompt.difficulty` is the larger
    operand's digit count. Example: `Prompt(text="12+345=", answer="357", difficulty=3.0)`.
    """
    max_digits = 3 if difficulty is None else int(difficulty)
    if not 1 <= max_digits <= 6:
        raise DatasetError(f"arithmetic difficulty is the max operand digits, 1..6; got {difficulty}")
    distinct = (10**max_digits) ** 2
    if size > distinct:
        raise DatasetError(f"arithmetic with up to {max_digits} digits has only {distinct} distinct problems; "
                         f"asked for {size}")
    rng = random.Random(seed)

    def operand() -> int:
        digits = rng.randint(1, max_digits)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    seen: set[tuple[int, int]] = set()
    prompts = []
    while len(prompts) < size:
        a, b = operand(), operand()
        if (a, b) in seen:
            continue
        seen.add((a, b))
        prompts.append(Prompt(
            id=f"arithmetic/d{max_digits}/s{seed}/{len(prompts)}",
            text=f"{a}+{b}=",
            answer=str(a + b),
            source="arithmetic",
            difficulty=float(max(len(str(a)), len(str(b)))),
            meta={"answer_format": "plain"},
        ))
    return prompts


# Maths tasks of reasoning-gym that run offline and whose answers math-verify parses.
REASONING_GYM_TASKS = (
    "basic_arithmetic", "chain_sum", "products", "gcd", "lcm", "simple_equations", "fraction_simplification",
)


def reasoning_gym_prompts(task: str, size: int, seed: int, difficulty: int | None = None) -> list[Prompt]:
    """`size` distinct problems of a reasoning-gym task at curriculum level `difficulty` (default 0).

    A level sets every curriculum attribute (terms, digits, ...) to that level or its top, in
    reasoning-gym's inclusive mode: level 2 draws from levels 0-2. See `reasoning_gym_levels`.
    """
    from reasoning_gym.factory import DATASETS, create_curriculum

    level = 0 if difficulty is None else int(difficulty)
    top = reasoning_gym_levels(task)
    if not 0 <= level <= top:
        raise DatasetError(f"{task}: difficulty is a curriculum level 0..{top}; got {difficulty}")
    curriculum = create_curriculum(task)
    curriculum.set_global_level(level)
    max_draws = 20 * size + 100
    config = curriculum.generate_configuration({"seed": seed, "size": max_draws})
    dataset = DATASETS[task][0](config=config)
    seen: set[str] = set()
    prompts = []
    for idx in range(max_draws):
        entry = dataset[idx]
        question = entry["question"].strip()
        if question in seen:
            continue
        seen.add(question)
        prompts.append(Prompt(
            id=f"{task}/L{level}/s{seed}/{idx}",
            text=question,
            answer=str(entry["answer"]).strip(),
            source=f"reasoning_gym/{task}",
            difficulty=float(level),
            meta={"answer_format": "boxed", "level": level},
        ))
        if len(prompts) == size:
            return prompts
    raise DatasetError(f"{task} level {level}: found only {len(prompts)} distinct problems in {max_draws} draws; "
                     f"asked for {size}")


def reasoning_gym_levels(task: str) -> int:
    """The highest curriculum level of a reasoning-gym task."""
    if task not in REASONING_GYM_TASKS:
        raise DatasetError(f"unknown reasoning-gym task {task!r}; choose from {list(REASONING_GYM_TASKS)}")
    from reasoning_gym.factory import create_curriculum

    return max(len(attr.levels) for attr in create_curriculum(task).attributes.values()) - 1


GENERATORS: dict[str, Callable[..., list[Prompt]]] = {"arithmetic": arithmetic_prompts}
for _task in REASONING_GYM_TASKS:
    GENERATORS[_task] = lambda size, seed, difficulty=None, _t=_task: reasoning_gym_prompts(_t, size, seed, difficulty)


def generate_prompts(name: str, size: int, seed: int, difficulty: int | None = None) -> list[Prompt]:
    """Seeded prompts from a generator (`arithmetic` or a reasoning-gym task; `reasoning_gym/` optional)."""
    key = name.removeprefix("reasoning_gym/")
    if key not in GENERATORS:
        raise DatasetError(f"unknown generator {name!r}; choose from {sorted(GENERATORS)}")
    if size < 1:
        raise DatasetError(f"{name}: size must be >= 1, got {size}")
    return GENERATORS[key](size, seed, difficulty)


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


def load_dataset_file(path: str | Path, schema: str | None = None) -> list[Prompt]:
    """Prompts from a local `.parquet` or `.jsonl` file in one of `SCHEMAS` (auto-detected if None).

    A malformed row (missing or empty required field, wrong type, duplicate id) raises a
    ValueError naming the file, the 1-based row number and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetMissingError(f"dataset file {path} does not exist")
    columns, rows = _read_rows(path)
    if not rows:
        raise DatasetError(f"{path}: the file has no rows (it is empty or blank)")
    if schema is None:
        try:
            schema = detect_schema(columns)
        except DatasetError:
            raise DatasetError(
                f"{path}: row 1: cannot tell the dataset schema from its fields {sorted(columns)}; a file needs a "
                f"problem field ({_schema_hint()}) and an answer field"
            ) from None
    name = schema
    if name not in SCHEMAS:
        raise DatasetError(f"{path}: unknown schema {name!r}; choose from {sorted(SCHEMAS)}")
    spec = SCHEMAS[name]
    boxed_from_solution = spec.answer not in columns and "solution" in columns
    prompts: list[Prompt] = []
    first_row_of: dict[str, int] = {}
    for n, row in rows:
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
        pid = str(raw_id) if name == "prompts" else f"{path.stem}/{raw_id}"
        if pid in first_row_of:
            raise DatasetError(f"{where}: field '{spec.id}' repeats id {raw_id!r} of row {first_row_of[pid]}")
        first_row_of[pid] = n
        prompts.append(_make_prompt(name, spec, row, pid, text, answer, path, where))
    if not prompts:
        raise DatasetError(f"{path}: no rows")
    return prompts


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
    """All columns seen and `(1-based row number, row)` pairs; jsonl rows are numbered by line."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        import pyarrow as pa

        try:
            names = set(pq.read_schema(path).names)
            # Read only what some schema uses: OpenR1's generations columns alone are gigabytes.
            wanted = {c for s in SCHEMAS.values() for c in (*s.text, s.answer, s.id, s.level, *s.meta) if c}
            wanted |= {"solution", "meta", "difficulty"}
            table = pq.read_table(path, columns=sorted(names & wanted))
        except (pa.ArrowException, OSError) as err:
            raise DatasetError(f"{path}: not a readable parquet file ({err})") from None
        return names, list(enumerate(table.to_pylist(), start=1))
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


# ---------------------------------------------------------------------------------------------
# Dispatch and split

_LEVEL_SUFFIX = re.compile(r"^(?P<name>[\w/]+):(?P<level>\d+)$")


def load_prompts(dataset: str, size: int | None = None, seed: int = 0) -> list[Prompt]:
    """A generator name (optionally `name:level`), a dataset file, or a folder with `prompts.jsonl`.

    Generators make exactly `size` prompts. Files give all rows, or a seeded sample of `size` of
    them (in file order) when the file has more.
    """
    path = Path(dataset).expanduser()
    if not path.exists():
        match = _LEVEL_SUFFIX.match(dataset)
        name, level = (match["name"], int(match["level"])) if match else (dataset, None)
        if name.removeprefix("reasoning_gym/") in GENERATORS:
            if size is None:
                raise DatasetError(f"dataset {dataset!r} is a generator: give a size")
            return generate_prompts(name, size, seed, difficulty=level)
        raise DatasetError(
            f"dataset {dataset!r}: no such file, and not a generator (choose from {sorted(GENERATORS)}, "
            "optionally with :level)"
        )
    if path.is_dir():
        path = path / "prompts.jsonl"
    prompts = load_dataset_file(path)
    if size is not None and size < len(prompts):
        keep = sorted(random.Random(seed).sample(range(len(prompts)), size))
        prompts = [prompts[i] for i in keep]
    return prompts


def split_prompts(prompts: Sequence[Prompt], eval_size: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """A seeded `(train, eval)` split with disjoint ids; each keeps the input order."""
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DatasetError(f"cannot split: prompt id {dup!r} appears more than once")
    if not 0 <= eval_size < len(prompts):
        raise DatasetError(f"eval_size must be in [0, {len(prompts)}) for {len(prompts)} prompts; got {eval_size}")
    held_out = set(random.Random(seed).sample(range(len(prompts)), eval_size))
    train = [p for i, p in enumerate(prompts) if i not in held_out]
    evals = [p for i, p in enumerate(prompts) if i in held_out]
    return train, evals


SFT_SEED_OFFSET = 1_000_003  # the SFT draw's seed, far from any seed a user picks
SFT_DRAW_SIZE = 2048  # DESIGN.md's CPU calibration point warm-starts on ~2k prompts


def warm_start_prompts(dataset: str, held_out: Sequence[Prompt], seed: int) -> list[Prompt]:
    """A separate draw for the SFT warm start, with every held-out prompt (RL pool, eval set) removed.

    Warm-starting on the RL prompts themselves memorises them: the tiny model then solves every
    training prompt (all-correct groups, no gradient) while held-out accuracy stays low.
    """
    texts = {p.text for p in held_out}
    draw = load_prompts(dataset, size=max(len(held_out), SFT_DRAW_SIZE), seed=seed + SFT_SEED_OFFSET)
    sft = [p for p in draw if p.text not in texts]
    if not sft:
        raise DatasetError(
            f"data.dataset {dataset!r}: no prompts left for the SFT warm start once the RL and eval prompts are "
            "held out; use a larger dataset or sft_steps=0"
        )
    return sft
