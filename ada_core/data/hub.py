"""Hugging Face hub ids for models and datasets: `org/name` or `org/name@revision`, pinned to a commit.

    Qwen/Qwen2.5-Math-1.5B            the model at the hub's `main`
    Qwen/Qwen2.5-Math-1.5B@<commit>   pinned: read from the cache with no network at all
    open-r1/OpenR1-Math-220k          a dataset; the files of its card's default config and `train` split

A hub id resolves to a snapshot folder of the local hub cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`,
else `~/.cache/huggingface/hub`: huggingface_hub's layout, `models--org--name/snapshots/<commit>/`
with `refs/<branch>` naming the commit). Where the hub is reachable the snapshot is downloaded
first (only what a run reads: weights and tokenizer; a dataset's parquet/jsonl files of one split);
offline (`HF_HUB_OFFLINE=1`) or unreachable, the cache alone answers, and a snapshot that is not
there fails with one line that says so (`HubError`, exit 2 on the CLI). `pin` turns an id into
`org/name@<commit>`: runs log that, so the revision a run used is on record.

The cache location, `HF_HUB_OFFLINE` and `HF_ENDPOINT` are read at every call (not when
huggingface_hub was imported), and hub telemetry is off.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ada_core.errors import InputError

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

Kind = Literal["model", "dataset"]

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9_./-]{{0,254}}))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A name with one of these endings is a file path, never a hub id.
_FILE_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv", ".yaml", ".yml", ".txt", ".gguf", ".safetensors")
# What a run reads from a model repo: config, weights as safetensors, the tokenizer. Not .bin/.pt/.gguf copies.
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
DATA_SUFFIXES = (".parquet", ".jsonl")
_TRUE = {"1", "ON", "YES", "TRUE"}


class HubError(InputError):
    """A hub id that cannot be resolved: not cached while offline, unknown, or without usable files."""


@dataclass(frozen=True)
class HubRef:
    """A parsed hub id; `revision` None means the hub's `main`."""

    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


@dataclass(frozen=True)
class Snapshot:
    """A resolved hub id: the snapshot folder of `repo` at `commit`."""

    repo: str
    kind: Kind
    commit: str
    path: Path

    @property
    def pinned(self) -> str:
        return f"{self.repo}@{self.commit}"


def parse_hub_id(name: str) -> HubRef | None:
    """`HubRef` for `org/name[@revision]`, or None when `name` is not hub-id shaped (a path, a file, a name).

    >>> parse_hub_id("Qwen/Qwen2.5-Math-1.5B@main")
    HubRef(repo='Qwen/Qwen2.5-Math-1.5B', revision='main')
    >>> parse_hub_id("data/math500.parquet") is None, parse_hub_id("tiny") is None
    (True, True)
    """
    text = str(name)
    match = _HUB_ID.match(text)
    if match is None or match["repo"].lower().endswith(_FILE_SUFFIXES) or ".." in match["repo"]:
        return None
    return HubRef(match["repo"], match["revision"])


def hub_cache() -> Path:
    """The hub cache huggingface_hub uses, read from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "huggingface" / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def repo_folder(repo: str, kind: Kind) -> Path:
    """`<cache>/models--org--name` (or `datasets--org--name`), huggingface_hub's cache layout."""
    return hub_cache() / f"{kind}s--{repo.replace('/', '--')}"


def cached_snapshot(ref: HubRef, kind: Kind) -> Snapshot | None:
    """The cached snapshot `ref` names (a commit, or a branch/tag through `refs/`), or None."""
    folder = repo_folder(ref.repo, kind)
    revision = ref.revision or "main"
    commit = revision if _COMMIT.match(revision) else None
    if commit is None:
        ref_file = folder / "refs" / revision
        if not ref_file.is_file():
            return None
        commit = ref_file.read_text().strip()
    path = folder / "snapshots" / commit
    return Snapshot(ref.repo, kind, commit, path) if path.is_dir() else None


def _holds(snapshot: Snapshot | None, patterns: list[str] | None) -> bool:
    """The snapshot exists and has a file matching one of `patterns` (None: any snapshot will do)."""
    if snapshot is None:
        return False
    if not patterns:
        return True
    return any(p.is_file() and any(fnmatch.fnmatch(p.relative_to(snapshot.path).as_posix(), pat) for pat in patterns)
               for p in snapshot.path.rglob("*"))


def resolve(ref: HubRef, kind: Kind, allow_patterns: list[str] | None = None,
            needs: list[str] | None = None) -> Snapshot:
    """The snapshot of `ref`: from the cache for a cached commit or when offline; else downloaded.

    A cached snapshot answers without the network when `ref` is a commit and it holds a file matching
    `needs` (None: any), or when offline. Raises `HubError` (one line) when the hub is offline or
    unreachable and the cache lacks it, or when the hub does not know the repo or revision.
    """
    label = f"{kind} {str(ref)!r}"
    revision = ref.revision or "main"
    if _COMMIT.match(revision) or offline():
        cached = cached_snapshot(ref, kind)
        if offline() and cached is not None or _holds(cached, needs):
            return cached
        if offline():
            raise HubError(
                f"{label}: not a local path, and the hub is offline (HF_HUB_OFFLINE=1) with no cached snapshot of "
                f"it in {hub_cache()}; download it where the hub is reachable (hf download {ref.repo}"
                f"{' --repo-type dataset' if kind == 'dataset' else ''}"
                f"{' --revision ' + revision if ref.revision else ''}) or give a local path"
            )
    from huggingface_hub import errors as hub_errors
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(ref.repo, repo_type=kind, revision=revision, cache_dir=str(hub_cache()),
                                 allow_patterns=allow_patterns, etag_timeout=10,
                                 endpoint=os.environ.get("HF_ENDPOINT") or None)  # read now, not at import
    except (hub_errors.RepositoryNotFoundError, hub_errors.GatedRepoError) as err:
        raise HubError(f"{label}: the hub has no such {kind} repo, or it is gated or private "
                       f"({type(err).__name__}); check the id, or log in with `hf auth login`") from None
    except hub_errors.RevisionNotFoundError:
        raise HubError(f"{label}: the hub has no revision {revision!r} of {ref.repo}") from None
    except Exception as err:  # noqa: BLE001 -- unreachable hub, offline mode set at import, a broken connection
        cached = cached_snapshot(ref, kind)
        if cached is not None:
            return cached
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise HubError(f"{label}: not a local path, not in the hub cache {hub_cache()}, and the hub could not be "
                       f"reached ({type(err).__name__}: {reason}); download it where the hub is reachable "
                       f"or give a local path") from None
    path = Path(path)
    return Snapshot(ref.repo, kind, path.name, path)


# ---------------------------------------------------------------------------------------------
# Models


def resolve_model_id(ref: HubRef) -> Path:
    """The snapshot folder of a hub model (weights, config and tokenizer files)."""
    return resolve(ref, "model", MODEL_PATTERNS, needs=["config.json"]).path


# ---------------------------------------------------------------------------------------------
# Datasets: the files of one config and split


@dataclass(frozen=True)
class DataFiles:
    """The files of a resolved hub dataset that a run reads, with where they came from."""

    snapshot: Snapshot
    config: str
    split: str
    files: tuple[Path, ...]


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


def split_patterns(configs: list[dict], split: str | None, label: str) -> tuple[str, str, list[str]]:
    """`(config name, split, file patterns)` of the card's default config (`default: true`, else the one
    named `default`, else the first) and `split` (None: `train` if the config has it, else its only split)."""
    if not configs:
        return "default", split or "train", [f"*{suffix}" for suffix in DATA_SUFFIXES]
    chosen = (next((c for c in configs if c.get("default") is True), None)
              or next((c for c in configs if c.get("config_name") == "default"), None) or configs[0])
    files = chosen.get("data_files")
    by_split: dict[str, list[str]] = {}
    if isinstance(files, str):
        by_split["train"] = [files]
    elif isinstance(files, list):
        for item in files:
            if isinstance(item, str):
                by_split.setdefault("train", []).append(item)
            elif isinstance(item, dict) and "split" in item:
                paths = item.get("path")
                by_split.setdefault(str(item["split"]), []).extend([paths] if isinstance(paths, str) else list(paths or []))
    name = str(chosen.get("config_name", "default"))
    if not by_split:
        return name, split or "train", [f"*{suffix}" for suffix in DATA_SUFFIXES]
    if split is None:
        split = "train" if "train" in by_split else next(iter(by_split)) if len(by_split) == 1 else None
        if split is None:
            raise HubError(f"{label}: config {name!r} has splits {sorted(by_split)} and none is 'train'")
    if split not in by_split:
        raise HubError(f"{label}: config {name!r} has no split {split!r}; it has {sorted(by_split)}")
    return name, split, by_split[split]


def dataset_files(ref: HubRef, split: str | None = None) -> DataFiles:
    """The parquet/jsonl files of `ref`'s default config and `split`, downloaded if need be."""
    label = f"dataset {str(ref)!r}"
    card_snapshot = resolve(ref, "dataset", ["README.md"])
    card_file = card_snapshot.path / "README.md"
    configs = card_configs(card_file.read_text(encoding="utf-8", errors="replace")) if card_file.is_file() else []
    config, split, patterns = split_patterns(configs, split, label)
    pinned = HubRef(ref.repo, card_snapshot.commit)
    snapshot = resolve(pinned, "dataset", patterns + ["README.md"], needs=patterns)
    found = sorted(
        p for p in snapshot.path.rglob("*")
        if p.is_file() and any(fnmatch.fnmatch(p.relative_to(snapshot.path).as_posix(), pat) for pat in patterns)
    )
    usable = tuple(p for p in found if p.suffix in DATA_SUFFIXES)
    if not usable:
        other = f" (it has {', '.join(sorted({p.suffix or p.name for p in found}))} files)" if found else ""
        raise HubError(f"{label}: snapshot {snapshot.commit[:12]} in {hub_cache()} has no .parquet or .jsonl files for "
                       f"config {config!r}, split {split!r} (patterns {patterns}){other}")
    return DataFiles(snapshot, config, split, usable)


def pin(name: str, kind: Kind) -> str:
    """`org/name@<commit>` for a hub id (resolved now), anything else unchanged."""
    ref = parse_hub_id(name)
    if ref is None:
        return name
    if kind == "model":
        return resolve(ref, "model", MODEL_PATTERNS, needs=["config.json"]).pinned
    return dataset_files(ref).snapshot.pinned


def snapshot_commit(path: str | Path) -> str | None:
    """The commit of a folder inside a hub cache snapshot (`.../snapshots/<commit>/...`), else None."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part == "snapshots" and _COMMIT.match(parts[i + 1]):
            return parts[i + 1]
    return None
