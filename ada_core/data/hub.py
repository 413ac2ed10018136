"""Hugging Face hub ids for models and datasets: `org/name` or `org/name@revision`, pinned to a commit.

    Qwen/Qwen2.5-Math-1.5B            the model at the hub's `main`
    Qwen/Qwen2.5-Math-1.5B@<commit>   pinned: read from the cache with no network at all
    open-r1/OpenR1-Math-220k          a dataset; the files of its card's default config and `train` split

A hub id resolves to a snapshot folder of the local hub cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`,
else `~/.cache/huggingface/hub`: huggingface_hub's layout, `models--org--name/snapshots/<commit>/`
with `refs/<branch>` naming the commit). Where the hub is reachable the snapshot is downloaded
first (only what a run reads: weights and tokenizer; a dataset's data files of one split);
offline (`HF_HUB_OFFLINE=1`) or unreachable, the cache alone answers, and a snapshot that is not
there fails with one line that says so (`HubError`, exit 2 on the CLI). `pin` turns an id into
`org/name@<commit>`: runs log that, so the revision a run used is on record.

A snapshot is only taken whole. huggingface_hub records the repo's file list at a commit when it
downloads it (`<repo folder>/trees/<commit>.json`: path, size, content id); every file a run reads
must be there at its recorded size, else the cache is completed (hub reachable) or refused naming
the files it lacks. A cache with no file list for the commit cannot be checked and is refused the
same way. Which files are a dataset's split is decided on that list, by the rules of `datasets`
(ada_core/data/hub_layout.py), and `DataFiles.identity` (the digest's input) names each file read.

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

from ada_core.data import hub_layout
from ada_core.data.files import load_dataset_file
from ada_core.errors import InputError
from ada_core.records import Prompt

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

Kind = Literal["model", "dataset"]

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9_./-]{{0,254}}))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A name with one of these endings is a file path, never a hub id.
_FILE_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv", ".yaml", ".yml", ".txt", ".gguf", ".safetensors")
# What a run reads from a model repo: config, weights as safetensors, the tokenizer. Not .bin/.pt/.gguf copies.
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
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


def is_commit(revision: str) -> bool:
    """A full commit id (40 hex), which names one content for ever; a branch or tag may move."""
    return bool(_COMMIT.match(revision))


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


@dataclass(frozen=True)
class ListedFile:
    """One file of a repo at a commit, as the hub cache's file list records it."""

    path: str
    size: int
    blob_id: str
    """The git object id of its content (an LFS file's pointer names its sha256): what the file is."""


def file_list(snapshot: Snapshot) -> dict[str, ListedFile] | None:
    """Path -> file of the repo at `snapshot.commit`, as huggingface_hub recorded it when it downloaded
    that commit (`<repo folder>/trees/<commit>.json`, written by `snapshot_download`), or None."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        files = get_cached_repo_tree(snapshot.repo, repo_type=snapshot.kind, revision=snapshot.commit,
                                     cache_dir=str(hub_cache()))
    except CachedRepoTreeNotFoundError:
        return None
    return {f.path: ListedFile(f.path, int(f.size), str(f.blob_id)) for f in files}


def wanted(listed: dict[str, ListedFile], allow_patterns: list[str]) -> list[str]:
    """The listed paths `allow_patterns` select, as `snapshot_download` selects what it downloads."""
    return sorted(p for p in listed if any(fnmatch.fnmatchcase(p, pat) for pat in allow_patterns))


def gaps(snapshot: Snapshot, allow_patterns: list[str]) -> str | None:
    """Why the cached `snapshot` is not whole for `allow_patterns` (the file list names files it lacks, or
    a size differs, or there is no file list to check it against); None when it is whole."""
    listed = file_list(snapshot)
    if listed is None:
        return (f"the hub cache has no file list for commit {snapshot.commit} "
                f"({repo_folder(snapshot.repo, snapshot.kind) / 'trees' / (snapshot.commit + '.json')}, which "
                "huggingface_hub's snapshot_download writes), so whether the snapshot is whole cannot be checked")
    missing = []
    for path in wanted(listed, allow_patterns):
        local = snapshot.path / path
        if not local.is_file():
            missing.append(path)
        elif local.stat().st_size != listed[path].size:
            missing.append(f"{path} ({local.stat().st_size} of {listed[path].size} bytes)")
    if not missing:
        return None
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return f"the cached snapshot {snapshot.commit[:12]} lacks {len(missing)} of its files: {shown}"


def _download_hint(ref: HubRef, kind: Kind, revision: str) -> str:
    return (f"hf download {ref.repo}{' --repo-type dataset' if kind == 'dataset' else ''}"
            f"{' --revision ' + revision if ref.revision else ''}")


def resolve(ref: HubRef, kind: Kind, allow_patterns: list[str], asked: str | None = None) -> Snapshot:
    """The snapshot of `ref`, whole for `allow_patterns`: from the cache for a cached commit or when
    offline; else downloaded (what is there already is not fetched again).

    A cached snapshot answers only when every file its commit's file list selects with
    `allow_patterns` is there, at its recorded size; a partial one is completed where the hub is
    reachable and refused where it is not, naming what it lacks. Raises `HubError` (one line) then,
    when the hub is offline or unreachable and the cache lacks it, or when the hub does not know the
    repo or revision. Errors name `asked` (the id as the user gave it), else `ref`.
    """
    label = f"{kind} {(asked or str(ref))!r}"
    revision = ref.revision or "main"
    problem = None
    if _COMMIT.match(revision) or offline():
        cached = cached_snapshot(ref, kind)
        problem = gaps(cached, allow_patterns) if cached is not None else None
        if cached is not None and problem is None:
            return cached
        if offline():
            where = (f"{problem}; the hub is offline (HF_HUB_OFFLINE=1)" if problem else
                     f"not a local path, and the hub is offline (HF_HUB_OFFLINE=1) with no cached snapshot of it in "
                     f"{hub_cache()}")
            raise HubError(f"{label}: {where}; download it where the hub is reachable "
                           f"({_download_hint(ref, kind, revision)}) or give a local path")
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
        problem = gaps(cached, allow_patterns) if cached is not None else None
        if cached is not None and problem is None:
            return cached
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        where = problem or f"not a local path, not in the hub cache {hub_cache()}"
        raise HubError(f"{label}: {where}, and the hub could not be reached ({type(err).__name__}: {reason}); "
                       f"download it where the hub is reachable or give a local path") from None
    path = Path(path)
    snapshot = Snapshot(ref.repo, kind, path.name, path)
    problem = gaps(snapshot, allow_patterns)
    if problem is not None:  # snapshot_download fell back to a cache it could not check
        raise HubError(f"{label}: {problem}; download it again where the hub is reachable "
                       f"({_download_hint(ref, kind, revision)})")
    return snapshot


def names_pin(asked: str, pinned: str) -> bool:
    """Whether `asked` (a value given again, e.g. on a resume) names what `pinned` (`org/name@<commit>`,
    what a run recorded) was pinned from: the same repo, unpinned, at a branch or tag, or at that commit.

    >>> names_pin("org/data", "org/data@" + "a" * 40), names_pin("org/data@main", "org/data@" + "a" * 40)
    (True, True)
    >>> names_pin("org/data@" + "b" * 40, "org/data@" + "a" * 40), names_pin("org/other", "org/data@" + "a" * 40)
    (False, False)
    """
    if asked == pinned:
        return True
    was, now = parse_hub_id(pinned), parse_hub_id(asked)
    if was is None or now is None or was.revision is None or not _COMMIT.match(was.revision):
        return False
    if Path(asked).expanduser().exists():
        return False  # a local folder of that name wins over the hub id
    return now.repo == was.repo and (now.revision is None or not _COMMIT.match(now.revision))


# ---------------------------------------------------------------------------------------------
# Models


def resolve_model_id(ref: HubRef) -> Path:
    """The snapshot folder of a hub model (weights, config and tokenizer files)."""
    return resolve(ref, "model", MODEL_PATTERNS).path


# ---------------------------------------------------------------------------------------------
# Datasets: the files of one config and split (ada_core/data/hub_layout.py: as `datasets` reads them)


@dataclass(frozen=True)
class DataFiles:
    """The files of a resolved hub dataset that a run reads, with where they came from."""

    snapshot: Snapshot
    config: str
    split: str
    files: tuple[Path, ...]
    listed: tuple[ListedFile, ...] = ()
    """The file list's record of each of `files`: what their content is."""

    @property
    def identity(self) -> str:
        """What was read, as text: the pinned id, config, split and each file with its size and content id.
        Two reads share it only when they read the same bytes of the same files (the digest's input)."""
        rows = [f"hub:{self.snapshot.pinned}", f"config:{self.config}", f"split:{self.split}"]
        rows += [f"{f.path}\x1f{f.size}\x1f{f.blob_id}" for f in self.listed]
        return "\x1e".join(rows)


def dataset_files(ref: HubRef, split: str | None = None) -> DataFiles:
    """The parquet/jsonl files of `ref`'s default config and `split` (None: `train`, else its only split),
    chosen from the commit's file list by the rules of `datasets`, downloaded if need be and checked whole."""
    label = f"dataset {str(ref)!r}"
    card_snapshot = resolve(ref, "dataset", ["README.md"])
    listed = file_list(card_snapshot) or {}
    card_file = card_snapshot.path / "README.md"
    configs = hub_layout.card_configs(card_file.read_text(encoding="utf-8", errors="replace")) if card_file.is_file() else []
    chosen = hub_layout.default_config(configs)
    config = str((chosen or {}).get("config_name", "default"))
    where = f"{label} (snapshot {card_snapshot.commit[:12]}): config {config!r}"
    try:
        prefix, splits = hub_layout.config_splits(chosen, sorted(listed))
        split = hub_layout.pick_split(splits, split)
    except hub_layout.LayoutError as err:
        raise HubError(f"{where}: {err}") from None
    try:
        paths = hub_layout.split_files(prefix, splits[split], sorted(listed))
    except hub_layout.LayoutError as err:
        raise HubError(f"{where}, split {split!r}: {err}") from None
    pinned = HubRef(ref.repo, card_snapshot.commit)
    snapshot = resolve(pinned, "dataset", [_literal(p) for p in paths] + ["README.md"], asked=str(ref))
    return DataFiles(snapshot, config, split, tuple(snapshot.path / p for p in paths), tuple(listed[p] for p in paths))


def _literal(path: str) -> str:
    """`path` as an fnmatch pattern that matches only itself (`[` and `*` in a file name are literal)."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def load_hub_prompts(ref: HubRef, split: str | None = None) -> list[Prompt]:
    """Every row of a hub dataset's default config and `split` (None: `train`, else its only split), its
    files read like local ones; ids are `<name>/<row id>`, unique over all of its files."""
    found = dataset_files(ref, split)
    prefix = ref.repo.split("/")[-1]
    prompts: list[Prompt] = []
    for file in found.files:
        prompts.extend(load_dataset_file(file, id_prefix=prefix if len(found.files) == 1 else f"{prefix}/{file.stem}"))
    for prompt in prompts:
        prompt.meta.update({"hub_id": found.snapshot.pinned, "hub_split": found.split})
    return prompts


def pin(name: str, kind: Kind) -> str:
    """`org/name@<commit>` for a hub id (resolved now), anything else unchanged."""
    ref = parse_hub_id(name)
    if ref is None:
        return name
    if kind == "model":
        return resolve(ref, "model", MODEL_PATTERNS).pinned
    return dataset_files(ref).snapshot.pinned


def snapshot_commit(path: str | Path) -> str | None:
    """The commit of a folder inside a hub cache snapshot (`.../snapshots/<commit>/...`), else None."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part == "snapshots" and _COMMIT.match(parts[i + 1]):
            return parts[i + 1]
    return None
