"""Which files of a hub dataset repo are one config's split: the rules Hugging Face `datasets` applies.

A run reads a hub dataset the way `datasets.load_dataset("org/name", split=...)` would, so the same
id gives the same rows in both. Everything here works on the repo's file list at one commit (the
hub cache's record of it, ada_core/data/hub.py), not on what happens to be on disk.

The config is the card's (`README.md` YAML header, `configs:`) default: `default: true`, else the
one named `default`, else the first. Its `data_files` map splits to patterns relative to its
`data_dir` (a string or a list of strings is the `train` split; a list of `{split, path}` names each);
any other form is refused, as `datasets` refuses it. A config without `data_files`, or a repo
without `configs:`, has its splits inferred from the file names, in this order, the first rule
that finds a file deciding (the `datasets` docs, "File names and splits"):

1. sharded files `data/<split>-00000-of-00003.parquet`: one split per `<split>` name;
2. evaluation logs (`*.eval`: split `logs`) and task folders (`task.toml`, `instruction.md`: `test`);
3. folders named for a split, at any depth (`train/`, `data/test/`, `valid-2024/`);
4. files named for a split (`train.jsonl`, `data/test-part1.parquet`, `my_eval.jsonl`);
5. otherwise every file is `train`.

Split words: train, training | validation, valid, dev, val | test, testing, eval, evaluation, each
as a whole word between separators (`-._ ` or a digit). Patterns are globs as `datasets` resolves
them through fsspec (`*` stays within a folder, `**` crosses folders); hidden files and folders,
`__special__` folders and the card and `datasets`' own metadata files are never data.

Of a split's files, the format is the most common extension (.parquet wins a tie), as `datasets`
picks its loader; a run reads .parquet and .jsonl, and refuses a split of another format.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import PurePosixPath

SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SEP = "[-._ 0-9]"
_SHARD = "[0-9][0-9][0-9][0-9][0-9]"
SHARDED = f"data/{{split}}-{_SHARD}-of-{_SHARD}*.*"
_SHARD_NAME = re.compile(r"^(?P<split>.+)-[0-9]{5}-of-[0-9]{5}.*\..*$")
_SPLIT_NAME = re.compile(r"^\w+(\.\w+)*$")
SPECIAL_LAYOUTS = ({"logs": ["**/*.eval"]}, {"test": ["**/task.toml", "**/instruction.md"]})
METADATA_NAMES = frozenset({"README.md", "config.json", "dataset_info.json", "dataset_infos.json",
                            "dummy_data.zip", "dataset_dict.json"})
READ_SUFFIXES = (".parquet", ".jsonl")
_TIE_ORDER = (".parquet", ".lance", ".vortex", ".arrow", ".jsonl", ".json", ".csv")  # `datasets`' order on a tie


class LayoutError(ValueError):
    """A card or a file list from which no split can be read as `datasets` would read it."""


def _dir_patterns(word: str) -> list[str]:
    return [f"**/{word}/**", f"**/{word}{_SEP}*/**", f"**/*{_SEP}{word}/**", f"**/*{_SEP}{word}{_SEP}*/**"]


def _file_patterns(word: str) -> list[str]:
    return [f"**/{word}{_SEP}*", f"**/*{_SEP}{word}{_SEP}*"]


def _by_words(patterns_of) -> dict[str, list[str]]:
    return {split: [p for word in words for p in patterns_of(word)] for split, words in SPLIT_WORDS.items()}


INFERRED_LAYOUTS = (*SPECIAL_LAYOUTS, _by_words(_dir_patterns), _by_words(_file_patterns), {"train": ["**"]})


@lru_cache(maxsize=512)
def _glob_regex(pattern: str) -> re.Pattern:
    """fsspec's glob semantics (what `datasets` resolves patterns with), as a regex over relative paths."""
    from fsspec.utils import glob_translate

    return re.compile(glob_translate(pattern))


def _hidden_parts(parts: Sequence[str]) -> int:
    return sum(1 for part in parts if part.startswith(".") and set(part) != {"."})


def _special_parts(parts: Sequence[str]) -> int:
    return sum(1 for part in parts if part.startswith("__"))


def glob(pattern: str, paths: Iterable[str]) -> list[str]:
    """The paths `pattern` matches, less what `datasets` never takes as data unless the pattern names it:
    hidden files or folders, `__special__` folders, the card and metadata files."""
    regex = _glob_regex(pattern)
    pat = PurePosixPath(pattern)
    ignored = METADATA_NAMES - {pat.name}
    out = []
    for path in paths:
        p = PurePosixPath(path)
        if not regex.match(path) or p.name in ignored:
            continue
        if _hidden_parts(p.parts) != _hidden_parts(pat.parts):
            continue
        if _special_parts(p.parent.parts) != _special_parts(pat.parent.parts):
            continue
        out.append(path)
    return out


def infer_splits(paths: Sequence[str]) -> dict[str, list[str]]:
    """Split -> patterns for files with no `data_files` to say (the module docstring's rules 1-5)."""
    sharded = glob(SHARDED.replace("{split}", "*"), paths)
    if sharded:
        names = {_SHARD_NAME.match(PurePosixPath(p).name)["split"] for p in sharded}
        bad = sorted(n for n in names if not _SPLIT_NAME.match(n))
        if bad:
            raise LayoutError(f"sharded data files name splits {bad}, which are not split names (letters, digits, _)")
        known = [s for s in SPLIT_WORDS if s in names]
        return {s: [SHARDED.format(split=s)] for s in known + sorted(names - set(known))}
    for layout in INFERRED_LAYOUTS:
        found = {split: patterns for split, patterns in layout.items() if any(glob(p, paths) for p in patterns)}
        if found:
            return found
    raise LayoutError("the repo has no data files")


def default_config(configs: list[dict]) -> dict | None:
    """The card's config a bare id reads: `default: true`, else the one named `default`, else the first."""
    if not configs:
        return None
    return (next((c for c in configs if c.get("default") is True), None)
            or next((c for c in configs if c.get("config_name") == "default"), None) or configs[0])


def config_splits(config: dict | None, paths: Sequence[str]) -> tuple[str, dict[str, list[str]]]:
    """(data_dir prefix, split -> patterns under it) of a card config (None: a repo without `configs:`)."""
    config = config or {}
    data_dir = str(config.get("data_dir") or "").strip("/")
    prefix = f"{data_dir}/" if data_dir else ""
    files = config.get("data_files")
    if files is None:
        inside = [p[len(prefix):] for p in paths if p.startswith(prefix)]
        return prefix, infer_splits(inside)
    if isinstance(files, str):
        return prefix, {"train": [files]}
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        return prefix, {"train": list(files)}
    if isinstance(files, list) and all(_split_entry(f) for f in files):
        splits = [str(f["split"]) for f in files]
        if len(set(splits)) != len(splits):
            raise LayoutError(f"data_files names a split twice: {splits}")
        return prefix, {str(f["split"]): [f["path"]] if isinstance(f["path"], str) else list(f["path"]) for f in files}
    raise LayoutError(f"data_files must be a pattern, a list of patterns, or a list of {{split, path}} entries "
                      f"(as `datasets` reads a card); got {files!r}")


def _split_entry(item: object) -> bool:
    return (isinstance(item, dict) and set(item) == {"split", "path"} and isinstance(item["split"], str)
            and bool(_SPLIT_NAME.match(item["split"])) and isinstance(item["path"], (str, list)))


def pick_split(splits: dict[str, list[str]], split: str | None) -> str:
    """`split`, or with None `train` if there is one, else the only split; LayoutError otherwise."""
    if split is None:
        if "train" in splits:
            return "train"
        if len(splits) == 1:
            return next(iter(splits))
        raise LayoutError(f"it has splits {sorted(splits)} and none is 'train': name one")
    if split not in splits:
        raise LayoutError(f"it has no split {split!r}; it has {sorted(splits)}")
    return split


def split_files(prefix: str, patterns: list[str], paths: Sequence[str]) -> list[str]:
    """The repo paths the split's patterns (relative to `prefix`) match, sorted, that a run reads.

    The format is the most common extension among them, .parquet first on a tie (how `datasets`
    picks its loader); files of other extensions are not part of the split, as there. A format
    other than .parquet or .jsonl is refused."""
    inside = [p[len(prefix):] for p in paths if p.startswith(prefix)]
    matched = sorted({prefix + p for pattern in patterns for p in glob(pattern.lstrip("/"), inside)})
    known = data_suffixes()
    suffixes = Counter(s for s in (PurePosixPath(p).suffix.lower() for p in matched) if s and (known is None or s in known))
    if not suffixes:
        raise LayoutError(f"no data files match {patterns}")
    fmt = max(suffixes, key=lambda s: (suffixes[s], *(s == t for t in _TIE_ORDER), s))
    if fmt not in READ_SUFFIXES:
        raise LayoutError(f"its files are {fmt} ({suffixes[fmt]} of them), which `datasets` would read; a run reads "
                          ".parquet and .jsonl: convert them, or give a local path")
    if fmt == ".jsonl" and suffixes.get(".json"):
        raise LayoutError(f"it mixes .jsonl and .json files ({suffixes['.json']} .json); a run reads .jsonl only")
    return [p for p in matched if PurePosixPath(p).suffix.lower() == fmt]


@lru_cache(maxsize=1)
def data_suffixes() -> frozenset[str] | None:
    """The extensions `datasets` has a loader for (a file of another is no data file there: a script, a
    licence), or None where this `datasets` does not say (then every extension counts)."""
    import ada_core.data.hf  # noqa: F401 -- first: it keeps `datasets` offline before `datasets` is imported

    try:
        from datasets.packaged_modules import _EXTENSION_TO_MODULE
    except ImportError:
        return None
    return frozenset(s.lower() for s in _EXTENSION_TO_MODULE)


def card_configs(card: str) -> list[dict]:
    """The `configs:` list of a dataset card's YAML header (empty when it has none)."""
    import yaml

    if not card.startswith("---"):
        return []
    end = card.find("\n---", 3)
    if end < 0:
        return []
    try:
        header = yaml.safe_load(card[3:end]) or {}
    except yaml.YAMLError:
        return []
    configs = header.get("configs") if isinstance(header, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []
