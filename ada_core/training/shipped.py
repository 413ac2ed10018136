"""Warm starts that ship with the package, so a profile's start is the same on every CPU and takes seconds.

The testbed's warm start is 2,000 floating-point SFT steps, and torch picks its kernels by the CPU's
instruction set, so each kind of CPU trained a different start from the same recipe
(docs/benchmarks/testbed.md, Reproducibility). The start trained once, and the pass rate at k = 16 of
every prompt of its curation pool, ship instead, in `ada_core/data/shipped/<name>/`:

    model/              the warm-started HF folder (config, safetensors, tokenizer, sft.json)
    scores.json.gz      {"k": 16, "correct": {prompt id: correct samples of k}} for every prompt scored
    splits.json.gz      per band of the paper grid: the curated, held-out and validation ids
    manifest.json       the recipe it answers, the sha256 of each file, the machine and date it was built on

Curation (`training.start.curate_for_model`) takes the shipped start where its inputs are the manifest's
recipe exactly (model, SFT steps and settings, dataset, pool size, seed, k, max_tokens, temperature,
positive threshold; any band), unless `sft.shipped` is false: the model folder is copied into
`ADA_HOME/cache/sft/shipped-<sha16>/` and the shipped rates replace sampling, so any band is a filter of
them. `rollout.micro_batch_size` is not part of the recipe: it sets how many rows go through the model
at once, while each sample draws from its own seeded generator (engines/transformers_engine.py).
`benchmarks/testbed_start.py` rebuilds the folder from the recipe.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "data" / "shipped"
MANIFEST = "manifest.json"
MODEL_DIR = "model"
SCORES = "scores.json.gz"
SPLITS = "splits.json.gz"
FORMAT = 1  # the manifest's layout; bump with a change that old readers would misread


class ShippedStartError(ValueError):
    """A shipped start whose files or pool do not match its manifest; the message says how to go on."""


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gzip_json(data: Any, path: str | Path) -> None:
    """`data` as compact JSON, gzipped with no name or time in its header: the same data gives the same bytes."""
    raw = json.dumps(data, separators=(",", ":")).encode()
    with Path(path).open("wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=9) as gz:
        gz.write(raw)


def read_gzip_json(path: str | Path) -> Any:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def recipe(model: str, sft_steps: int, dataset: str, pool_size: int, seed: int, k: int, max_tokens: int,
           temperature: float, positive_threshold: float, sft: dict[str, Any] | None) -> dict[str, Any]:
    """What a start and its curation scores are a function of, in one comparable form: the SFT settings
    whole (SftConfig's defaults filled in, `shipped` left out: it picks a start, it does not make one)."""
    from ada_core.config.schema import SftConfig

    settings = SftConfig(**(sft or {})).model_dump()
    settings.pop("shipped", None)
    return {"model": str(model), "sft_steps": int(sft_steps), "sft": settings, "dataset": str(dataset),
            "pool_size": int(pool_size), "seed": int(seed), "k": int(k), "max_tokens": int(max_tokens),
            "temperature": float(temperature), "positive_threshold": float(positive_threshold)}


@dataclass(frozen=True)
class ShippedStart:
    """One shipped folder: its manifest, and the model and rates it holds."""

    folder: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def model_sha256(self) -> str:
        return self.manifest["model_sha256"]

    @property
    def key(self) -> str:
        """What the curation key holds for this start: its name and the first 16 of its weights' sha256."""
        return f"shipped-{self.name}-{self.model_sha256[:16]}"

    def check_files(self) -> None:
        """Every file the manifest lists has its sha256, and the weights theirs; else ShippedStartError."""
        from ada_core.models import weights_sha256

        bad = [rel for rel, digest in self.manifest["files"].items()
               if not (self.folder / rel).is_file() or file_sha256(self.folder / rel) != digest]
        if not bad and weights_sha256(self.folder / MODEL_DIR) != self.model_sha256:
            bad = [f"{MODEL_DIR}/ (weights)"]
        if bad:
            raise ShippedStartError(
                f"the shipped start {self.folder} does not match its manifest ({', '.join(bad)}): reinstall the "
                "package, rebuild it with benchmarks/testbed_start.py, or set sft.shipped: false to train the recipe")

    def check_pool(self, pool_digest: str) -> None:
        """The curation pool drawn now is the one the shipped rates scored (the generator has not changed)."""
        if pool_digest != self.manifest["pool_digest"]:
            raise ShippedStartError(
                f"the shipped start {self.name!r} scored a pool with digest {self.manifest['pool_digest']}, but "
                f"{self.manifest['recipe']['dataset']!r} now draws {pool_digest}: the generator changed since it was "
                "built. Rebuild it with benchmarks/testbed_start.py, or set sft.shipped: false to train the recipe")

    def rates(self) -> dict[str, float]:
        """Every scored prompt's pass rate: correct samples of k over k (the file checked against the manifest)."""
        if file_sha256(self.folder / SCORES) != self.manifest["files"][SCORES]:
            raise ShippedStartError(
                f"the shipped start {self.folder}: {SCORES} does not match its manifest: reinstall the package, "
                "rebuild it with benchmarks/testbed_start.py, or set sft.shipped: false to train the recipe")
        scores = read_gzip_json(self.folder / SCORES)
        k = scores["k"]
        return {pid: correct / k for pid, correct in scores["correct"].items()}

    def describe(self) -> str:
        return (f"shipped start {self.name!r} ({self.folder}): weights sha256 {self.model_sha256}, "
                f"scores sha256 {self.manifest['files'][SCORES]}")

    def install(self) -> Path:
        """The model folder as `ADA_HOME/cache/sft/shipped-<sha16>/` (copied once, checked against the manifest
        first), so a run's start model lives in its home as a trained one does, whatever happens to the package."""
        from ada_core.models.build import atomic_build, built_once
        from ada_core.paths import cache_dir

        out = cache_dir() / "sft" / f"shipped-{self.model_sha256[:16]}"
        marker = {"name": "shipped", "start": self.name, "model_sha256": self.model_sha256}

        def build() -> Path:
            self.check_files()

            def write(tmp: Path) -> None:
                for f in sorted((self.folder / MODEL_DIR).iterdir()):
                    if f.is_file():
                        shutil.copyfile(f, tmp / f.name)

            return atomic_build(out, write, marker)

        return built_once(out, marker, build)


def shipped_starts(root: str | Path = SHIPPED_DIR) -> list[ShippedStart]:
    """Every shipped start under `root` (a folder with a manifest of a known format)."""
    root = Path(root)
    found = []
    for manifest in sorted(root.glob(f"*/{MANIFEST}")) if root.is_dir() else []:
        data = json.loads(manifest.read_text())
        if data.get("format") == FORMAT:
            found.append(ShippedStart(manifest.parent, data))
    return found


def shipped_start_for(inputs: dict[str, Any], root: str | Path = SHIPPED_DIR) -> ShippedStart | None:
    """The shipped start whose recipe is `inputs` (a `recipe(...)` dict), or None."""
    return next((s for s in shipped_starts(root) if s.manifest["recipe"] == inputs), None)
