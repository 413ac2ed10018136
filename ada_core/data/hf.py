"""Hugging Face `datasets` for local files: offline, cached under ADA_HOME, no hub.

`datasets` keeps every table as memory-mapped Arrow and caches each `map`/`filter` result by
fingerprint (the input's fingerprint + the function and its arguments), so repeating a load or a
curation stage on unchanged data reads the cached Arrow file instead of recomputing it. The cache
lives in ADA_HOME/cache/hf_datasets; HF_DATASETS_OFFLINE is set (unless the user set it) before
`datasets` is imported: `datasets` itself never reads from the hub. Hub datasets are downloaded
by ada_core/data/hub.py (huggingface_hub, into the hub cache) and read from there as local files,
so HF_HUB_OFFLINE is left as the user set it.
"""

from __future__ import annotations

import builtins
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import datasets  # noqa: E402

from ada_core.paths import cache_dir  # noqa: E402
from ada_core.records import Prompt  # noqa: E402

T = TypeVar("T")

datasets.disable_progress_bars()  # the flows report progress as Prefect artifacts instead

# A checked dataset row (ada_core.data.RECORD_COLUMNS): meta is JSON, raw_id the id as the file wrote it.
RECORD_FEATURES = datasets.Features({
    "row": datasets.Value("int64"),
    "id": datasets.Value("string"),
    "raw_id": datasets.Value("string"),
    "text": datasets.Value("string"),
    "answer": datasets.Value("string"),
    "source": datasets.Value("string"),
    "difficulty": datasets.Value("float64"),
    "meta": datasets.Value("string"),
})
PROMPT_FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "text": datasets.Value("string"),
    "answer": datasets.Value("string"),
    "source": datasets.Value("string"),
    "difficulty": datasets.Value("float64"),
})

SAVED_FEATURES = datasets.Features({**PROMPT_FEATURES, "meta": datasets.Value("string")})


def datasets_cache_dir() -> Path:
    path = cache_dir() / "hf_datasets"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _print_to_stdout(*args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None,
                     flush: bool = False) -> None:
    stream = file if file is not None else sys.stdout
    stream.write((" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end))
    if flush:
        stream.flush()


@contextmanager
def plain_print() -> Iterator[None]:
    """`print` writes to `sys.stdout` again while `datasets` fingerprints a function.

    dill finds a function's globals by disassembling it into a swapped-in `sys.stdout`. A Prefect
    flow with `log_prints=True` patches `print` to log instead, so the disassembly flooded the
    flow's log and dill saw no globals at all (a fingerprint blind to them).
    """
    saved = builtins.print
    builtins.print = _print_to_stdout
    try:
        yield
    finally:
        builtins.print = saved


def load_parquet(path: Path, columns: list[str]) -> datasets.Dataset:
    """A local parquet file's `columns` as an Arrow-backed Dataset, converted once and then cached."""
    with plain_print():
        return datasets.Dataset.from_parquet(str(path), columns=columns, cache_dir=str(datasets_cache_dir()),
                                             keep_in_memory=False)


def checked_parquet(path: Path, columns: list[str], check: Callable[[datasets.Dataset], T]) -> T:
    """`check(load_parquet(path, columns))`. A `DatasetError` from it (a bad row, a repeated id) leaves no
    cache behind: the file's Arrow conversion, the map results beside it, datasets' lock files for them,
    and the cache folders (up to ADA_HOME) this call created are removed before the error goes on, so a
    refused file writes nothing under ADA_HOME. Only a file that passes is kept, for the next load."""
    from ada_core.errors import DatasetError
    from ada_core.paths import ada_home

    home = ada_home(create=False)
    chain = [home, home / "cache", home / "cache" / "hf_datasets"]
    existed = [folder.exists() for folder in chain]
    table = None
    try:
        table = load_parquet(path, columns)
        return check(table)
    except DatasetError:
        if table is not None:
            _discard(table, chain[-1])
        for folder, was in reversed(list(zip(chain, existed))):
            if was:
                break
            try:
                folder.rmdir()  # only an empty one: never what another process put there meanwhile
            except OSError:
                break
        raise


def _discard(dataset: datasets.Dataset, root: Path) -> None:
    """Remove the builder folders holding `dataset`'s Arrow files, their lock files, and empty parents."""
    for cache_file in dataset.cache_files:
        folder = Path(cache_file["filename"]).parent  # <root>/parquet/<config>/<version>/<hash>
        if root not in folder.parents:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        config, version = folder.parent.parent.name, folder.parent.name  # the builder hash is shared; these are not
        for lock in [*folder.parent.glob(f"{folder.name}*.lock"), *root.glob(f"*_{config}_{version}_{folder.name}.lock")]:
            lock.unlink(missing_ok=True)
        for parent in folder.parents:
            if parent == root:
                break
            try:
                parent.rmdir()
            except OSError:
                break


def cached_map(dataset: datasets.Dataset, function: Any, **kwargs: Any) -> datasets.Dataset:
    """`dataset.map(function, **kwargs)`, cached by fingerprint next to the dataset's Arrow files."""
    with plain_print():
        return dataset.map(function, **kwargs)


def prompts_dataset(prompts: Sequence[Prompt], fingerprint: str) -> datasets.Dataset:
    """Prompts as an in-memory Dataset with `PROMPT_FEATURES` (what MLflow's dataset inputs show as the schema).

    `fingerprint` is given (`ada_core.data.prompts_digest`): left to itself, `datasets` would hash
    the whole table to make one.
    """
    table = datasets.table.InMemoryTable.from_pydict({
        "id": [p.id for p in prompts], "text": [p.text for p in prompts], "answer": [p.answer for p in prompts],
        "source": [p.source for p in prompts], "difficulty": [p.difficulty for p in prompts],
    }, schema=PROMPT_FEATURES.arrow_schema)
    return datasets.Dataset(table, info=datasets.DatasetInfo(features=PROMPT_FEATURES), fingerprint=fingerprint)


def save_prompts(prompts: Sequence[Prompt], directory: Path) -> None:
    """`save_to_disk` the prompts (PROMPT_FEATURES + meta as JSON) into `directory`."""
    import json

    table = datasets.table.InMemoryTable.from_pydict({
        "id": [p.id for p in prompts], "text": [p.text for p in prompts], "answer": [p.answer for p in prompts],
        "source": [p.source for p in prompts], "difficulty": [p.difficulty for p in prompts],
        "meta": [json.dumps(p.meta, ensure_ascii=False, default=str) for p in prompts],
    }, schema=SAVED_FEATURES.arrow_schema)
    with plain_print():
        datasets.Dataset(table, info=datasets.DatasetInfo(features=SAVED_FEATURES)).save_to_disk(str(directory))


def _apply_to_text(batch: dict[str, list], function: Any) -> dict[str, list]:
    return {"key": [function(text) for text in batch["text"]]}


def text_keys(prompts: Sequence[Prompt], function: Any, digest: str) -> list[str]:
    """`function(prompt.text)` for every prompt, through a fingerprint-cached `datasets.map`.

    The texts are saved once under the cache as an on-disk dataset named by `digest` (the
    prompts' `ada_core.data.prompts_digest`); `map` then caches its result next to them, keyed by
    that dataset and the function's code, so curating the same pool again reads the keys back.
    """
    import shutil
    import tempfile

    folder = datasets_cache_dir() / "prompt_texts" / digest
    if not (folder / "dataset_info.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=folder.parent))
        try:
            table = datasets.table.InMemoryTable.from_pydict({"text": [p.text for p in prompts]})
            with plain_print():
                datasets.Dataset(table, fingerprint=digest).save_to_disk(str(staged / "set"))
            try:
                (staged / "set").rename(folder)
            except OSError:  # another process saved the same texts first
                pass
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    texts = datasets.load_from_disk(str(folder))
    keys = cached_map(texts, _apply_to_text, batched=True, batch_size=2000, remove_columns=["text"],
                      fn_kwargs={"function": function})
    return keys.data.column("key").to_pylist()  # one Arrow conversion; `keys["key"]` would read row by row
