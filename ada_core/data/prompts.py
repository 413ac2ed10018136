"""Prompt sets: seeded generators, loaders for the paper's datasets, and the train/eval split.

Every prompt says how its answer is read from a completion in `meta["answer_format"]`:
`plain` (the completion IS the answer: the tiny model's `a+b=`) or `boxed` (the last `\\boxed{}`).

`load_prompts("arithmetic", 2048, seed=0)` generates; `load_prompts("chain_sum:2", ...)` generates
reasoning-gym's chain_sum at curriculum level 2; `load_prompts("data/math500.parquet", ...)` loads a
local parquet or jsonl file in one of the HF schemas below (auto-detected from its columns);
`load_prompts("open-r1/OpenR1-Math-220k@<rev>", ...)` loads a hub dataset's files the same way
(ada_core/data/hub.py). An existing path wins over a generator name, and both over a hub id.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import NamedTuple
from pathlib import Path

from ada_core.config import TrainConfig
from ada_core.data import hub
from ada_core.data.files import load_dataset_file
from ada_core.data.generators import GENERATORS, arithmetic_prompts, generate_prompts, slip_carries
from ada_core.data.suites import pin_benchmarks
from ada_core.errors import DatasetError
from ada_core.records import Prompt

# ---------------------------------------------------------------------------------------------
# Digests: what MLflow's dataset inputs and the curation cache key on


def data_digest(dataset: str) -> str:
    """sha256 (first 16 hex) of a dataset file's bytes (a folder: its prompts.jsonl), of a generator's name,
    or of what a hub dataset id reads: its commit, config, split and each file with its content id."""
    path = Path(dataset).expanduser()
    if path.is_dir():
        path = path / "prompts.jsonl"
    h = hashlib.sha256()
    ref = hub_dataset(dataset)
    if ref is not None:
        h.update(hub.dataset_files(ref).identity.encode())
    elif path.is_file():
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    else:
        h.update(dataset.encode())
    return h.hexdigest()[:16]


def prompts_digest(prompts: Sequence[Prompt]) -> str:
    """sha256 (first 16 hex) of the prompts' ids, texts and answers, in order: the digest of one split."""
    h = hashlib.sha256()
    for p in prompts:  # length-prefixed fields: no two different lists of prompts share a byte stream
        h.update(f"{len(p.id)}:{p.id}{len(p.text)}:{p.text}{len(p.answer)}:{p.answer}".encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Dispatch and split

_LEVEL_SUFFIX = re.compile(r"^(?P<name>[\w/]+):(?P<level>\d+)$")


def load_prompts(dataset: str, size: int | None = None, seed: int = 0) -> list[Prompt]:
    """A generator name (optionally `name:level`), a dataset file, or a folder with `prompts.jsonl`.

    Generators make exactly `size` prompts. Files give all rows, or a seeded sample of `size` of
    them (in file order) when the file has more.
    """
    path = Path(dataset).expanduser()
    ref = hub_dataset(dataset)
    if ref is not None:
        prompts = hub.load_hub_prompts(ref)
    elif not path.exists():
        match = _LEVEL_SUFFIX.match(dataset)
        name, level = (match["name"], int(match["level"])) if match else (dataset, None)
        if name.removeprefix("reasoning_gym/") in GENERATORS:
            if size is None:
                raise DatasetError(f"dataset {dataset!r} is a generator: give a size")
            return generate_prompts(name, size, seed, difficulty=level)
        raise DatasetError(
            f"dataset {dataset!r}: no such file, and not a generator (choose from {sorted(GENERATORS)}, "
            "optionally with :level) or a hub id (org/name[@revision])"
        )
    else:
        prompts = load_dataset_file(path / "prompts.jsonl" if path.is_dir() else path)
    if size is not None and size < len(prompts):
        keep = sorted(random.Random(seed).sample(range(len(prompts)), size))
        prompts = [prompts[i] for i in keep]
    return prompts


def hub_dataset(dataset: str) -> hub.HubRef | None:
    """The hub id `dataset` names, or None: an existing path or a generator name is not one."""
    if Path(dataset).expanduser().exists():
        return None
    match = _LEVEL_SUFFIX.match(dataset)
    if (match["name"] if match else dataset).removeprefix("reasoning_gym/") in GENERATORS:
        return None
    return hub.parse_hub_id(dataset)


def pin_hub_ids(config: TrainConfig) -> TrainConfig:
    """`config` with every hub id it reads pinned to `org/name@<commit>` (resolved now: downloaded where
    the hub is reachable, from the cache otherwise): its model, its dataset and its `eval_suite`'s
    benchmarks (`eval_suite_revisions`, those it gives kept), so config.yaml records what was read."""
    model = config.model if Path(config.model).expanduser().exists() else hub.pin(config.model, "model")
    ref = hub_dataset(config.data.dataset)
    dataset = hub.dataset_files(ref).snapshot.pinned if ref is not None else config.data.dataset
    benchmarks = pin_benchmarks(config.eval_suite, config.eval_suite_revisions) if config.eval_suite else []
    update = {"model": model, "data": config.data.model_copy(update={"dataset": dataset}),
              "eval_suite_revisions": benchmarks or list(config.eval_suite_revisions)}
    if (model, dataset, update["eval_suite_revisions"]) == (config.model, config.data.dataset,
                                                            list(config.eval_suite_revisions)):
        return config
    return config.model_copy(update=update)


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


class RunSplit(NamedTuple):
    """A run's prompts: what it trains on, what it reports (held out), what picks its best policy (validation)."""

    training: list[Prompt]
    held_out: list[Prompt]
    validation: list[Prompt]


def run_split(data, seed: int) -> RunSplit:
    """A run's split of `data` (a DataConfig), drawn with `data.seed` (`seed`, the run's, when that is None):
    `data.train_size + eval_size + val_size` prompts, the held-out ones taken first (so `val_size` does not move
    them), then the validation ones from the rest; the training side cut to `data.train_pool` when set (the fixed
    pool reused over epochs). The trainer, the flows' input check and the evaluate flow's default held-out set are
    all this one split."""
    seed = seed if data.seed is None else data.seed
    prompts = load_prompts(data.dataset, size=data.train_size + data.eval_size + data.val_size, seed=seed)
    if data.eval_size >= len(prompts):  # a small file: name the field and the file, and what would fit
        raise DatasetError(f"data.eval_size = {data.eval_size} held-out prompts, but data.dataset {data.dataset} "
                           f"has {len(prompts)} prompts: lower data.eval_size to at most {len(prompts) - 1} "
                           "(the rest train), or use a larger dataset")
    train, evals = split_prompts(prompts, eval_size=data.eval_size, seed=seed)
    validation: list[Prompt] = []
    if data.val_size:
        if data.val_size >= len(train):
            raise DatasetError(f"data.val_size: {data.val_size} validation prompts leave none to train on: "
                               f"data.dataset {data.dataset} gives {len(train)} once data.eval_size={data.eval_size} "
                               "are held out")
        train, validation = split_prompts(train, eval_size=data.val_size, seed=seed + VALIDATION_SEED_OFFSET)
    if data.train_pool is not None:
        train = train[: data.train_pool]
    return RunSplit(train, evals, validation)


VALIDATION_SEED_OFFSET = 7_919  # the validation draw's seed, apart from the held-out draw's
SFT_SEED_OFFSET = 1_000_003  # the SFT draw's seed, far from any seed a user picks
SFT_DRAW_SIZE = 2048  # DESIGN.md's CPU calibration point warm-starts on ~2k prompts


def warm_start_prompts(dataset: str, held_out: Sequence[Prompt], seed: int, size: int | None = None,
                       carry_slip: float = 0.0) -> list[Prompt]:
    """A separate draw for the SFT warm start, with every held-out prompt (RL pool, eval set) removed.

    Warm-starting on the RL prompts themselves memorises them: the tiny model then solves every
    training prompt (all-correct groups, no gradient) while held-out accuracy stays low.
    `size` None draws max(len(held_out), 2048) distinct prompts; a number draws that many independently
    (repeats kept: a distinct draw as large as the space of short sums skews towards long operands),
    from built-in generators only. `carry_slip` > 0 gives `a+b=` targets with dropped carries
    (`generators.slip_carries`).
    """
    texts = {p.text for p in held_out}
    if size is None:
        draw = load_prompts(dataset, size=max(len(held_out), SFT_DRAW_SIZE), seed=seed + SFT_SEED_OFFSET)
    else:
        match = _LEVEL_SUFFIX.match(dataset)
        name, level = (match["name"], int(match["level"])) if match else (dataset, None)
        if name != "arithmetic" or Path(dataset).expanduser().exists():
            raise DatasetError(f"sft.prompts: {size} independent draws need the `arithmetic` generator; data.dataset "
                               f"is {dataset!r}: use sft.prompts: null")
        draw = arithmetic_prompts(size, seed + SFT_SEED_OFFSET, difficulty=level, distinct=False)
    sft = [p for p in draw if p.text not in texts]
    if not sft:
        raise DatasetError(
            f"data.dataset {dataset!r}: no prompts left for the SFT warm start once the RL and eval prompts are "
            "held out; use a larger dataset or sft_steps=0"
        )
    return slip_carries(sft, carry_slip, seed + SFT_SEED_OFFSET)
