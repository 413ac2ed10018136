"""The run's config sections besides the algorithm and the rollout: its prompts (`data`), the SFT warm start
(`sft`), the prompt ledger, checkpoints kept, the training ranks (`distributed`) and the verifier's budget."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from ada_core.config.applies import ALWAYS, when
from ada_core.config.strict import _Strict


class DataConfig(_Strict):
    dataset: str = Field(
        "arithmetic",
        description="Training prompts: a built-in generator name (`arithmetic`, or a reasoning-gym task), a "
        "local parquet/jsonl path in one of the supported HF schemas, or a hub dataset id org/name[@revision] "
        "(its default config's `train` split; runs log it pinned to its commit).",
        json_schema_extra=ALWAYS,
    )
    train_size: int = Field(2048, ge=1, description="Prompts generated for built-in generators. Ours.",
                            json_schema_extra=ALWAYS)
    eval_size: int = Field(128, ge=1, description="Held-out prompts for periodic evaluation. Ours.",
                           json_schema_extra=ALWAYS)
    max_prompt_tokens: int = Field(
        1024, ge=1, description="Prompts longer than this many tokens (chat template included) are skipped, and the "
        "count logged; a run fails only if too few remain. Ref: verl max_prompt_length=1024 with "
        "filter_overlong_prompts.",
        json_schema_extra=ALWAYS,
    )
    curation_k: int = Field(16, ge=1, description="Samples per prompt in the difficulty filter. Paper: 16.",
                            json_schema_extra=when("run.curate == true"))
    pass_rate_ceiling: float = Field(
        0.3125, gt=0.0, le=1.0, description="Difficulty filter keeps 0 < pass rate <= this. Paper easy: 0.3125.",
        json_schema_extra=when("run.curate == true", "data.keep_pass_rate == null")
    )
    keep_pass_rate: list[float] | None = Field(
        None, min_length=2, max_length=2,
        description="Difficulty filter keeps low <= pass rate <= high (measured at curation_k draws) instead of "
        "0 < pass rate <= pass_rate_ceiling, which it then replaces. The paper's hard set, 1-2 correct of 16: "
        "[0.0625, 0.125] with curation_k 16. None = the ceiling rule.",
        json_schema_extra=when("run.curate == true"),
    )
    seed: int | None = Field(
        None, description="The data seed: it draws the prompts, the training/held-out/validation split, the SFT warm "
        "start's prompts and order, and the evaluation's sampling, so the run's `seed` moves RL's randomness only. "
        "None = the run's `seed` (one run alone). compare, sweep and paper-tables set it to 0 for every child unless "
        "their overrides give it, so a comparison's seeds share their start model and their exam, as the paper's "
        "seeds share a base model and fixed benchmarks; give it to vary the split as well. Ours.",
        json_schema_extra=ALWAYS,
    )
    val_size: int = Field(
        0, ge=0, description="Validation prompts, drawn beside the held-out ones and disjoint from both splits: scored "
        "at every evaluation (`accuracy/val_*`), and a comparison registers the policy that is best on them, not on "
        "the held-out set it reports. 0 = no validation split (the held-out set picks). Ours.",
        json_schema_extra=ALWAYS,
    )
    train_pool: int | None = Field(
        None, ge=1,
        description="Train on only the first this-many training prompts (after the held-out split), reused over "
        "epochs: the paper's fixed-pool regime. None = all of them. Ours.",
        json_schema_extra=ALWAYS,
    )


    @model_validator(mode="after")
    def _band_is_a_band(self) -> "DataConfig":
        band = self.keep_pass_rate
        if band is not None and not 0.0 <= band[0] <= band[1] <= 1.0:
            raise ValueError(f"data.keep_pass_rate: need 0 <= low <= high <= 1, got {list(band)}")
        return self


class SftConfig(_Strict):
    """The SFT warm start (`sft_steps` > 0): supervised steps on a separate draw of the dataset before RL."""

    lr: float = Field(2e-3, gt=0.0, description="AdamW learning rate, constant. Ours: 2e-3 (3e-3 stalls `tiny`).",
                      json_schema_extra=when("sft_steps > 0"))
    batch_size: int = Field(128, ge=1, description="Prompts per SFT step. Ours.", json_schema_extra=when("sft_steps > 0"))
    prompts: int | None = Field(
        None, ge=1,
        description="Size of the SFT draw. None = max(2048, the run's prompts) distinct prompts; a number = that many "
        "independent draws of the generator (repeats allowed, as a stream of fresh problems would give; built-in "
        "generators only), none of them a training, held-out or validation prompt. Ours.",
        json_schema_extra=when("sft_steps > 0"),
    )
    carry_slip: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="`arithmetic` only: the chance that each carry of an SFT target is dropped (`58+67=` taught as "
        "`115`, not `125`, when the tens' carry slips), so the warm-started model adds without carrying some of the "
        "time and RL has a skill to learn that generalises: a sum with c carries is right about (1 - carry_slip)^c "
        "of the time. 0 = correct targets. Ours.",
        json_schema_extra=when("sft_steps > 0"),
    )
    shipped: bool = Field(
        True,
        description="Use the warm start and curation scores that ship with the package (ada_core/data/shipped/; "
        "the testbed's) where the curation's inputs are their recipe exactly, so every CPU gets the same start in "
        "seconds; false trains and scores from the recipe on this machine (benchmarks/testbed_start.py rebuilds "
        "the shipped one). Ours.",
        json_schema_extra=when("sft_steps > 0", "run.curate == true"),
    )


class LedgerConfig(_Strict):
    """The prompt ledger (ada_core/run/ledger.py): one SQL row per (run, step, prompt drawn)."""

    enabled: bool = Field(True, description="Write the prompt ledger. Ours: on.", json_schema_extra=ALWAYS)
    url: str | None = Field(
        None,
        description="SQLAlchemy URL, e.g. postgresql://user@host/db. None = $ADA_LEDGER_URL, else SQLite at "
        "$ADA_HOME/ledger.db. No passwords here (the config is logged): use $ADA_LEDGER_URL or PGPASSWORD.",
        json_schema_extra=when("ledger.enabled == true"),
    )

    @model_validator(mode="after")
    def _no_password(self) -> "LedgerConfig":
        if self.url and re.search(r"://[^/@]*:[^/@]*@", self.url):
            raise ValueError("ledger.url holds a password; the config is logged, so pass it via $ADA_LEDGER_URL "
                             "or PGPASSWORD instead")
        return self


class CheckpointConfig(_Strict):
    """What `checkpoint_every` writes is kept and checked (ada_core/run/checkpoints.py)."""

    keep_last: int = Field(
        3, ge=0, description="Checkpoints kept on disk; older ones are deleted after each save, never the newest "
        "good one. 0 = keep all. Ours: 3, so a damaged newest checkpoint still has two to fall back to.",
        json_schema_extra=ALWAYS,
    )


class DistributedConfig(_Strict):
    """How many training ranks the update runs on (see ada_core/engines/rank_group.py)."""

    num_ranks: int = Field(
        1, ge=1, description="Training ranks (data-parallel DeepSpeed processes). 1 = the update runs in this "
        "process and Ray is never started; N > 1 = N Ray actors in one placement group, each rank training "
        "on its share of every mini-batch with global loss denominators. Ours: 1.", json_schema_extra=ALWAYS
    )
    ray_address: str | None = Field(
        None, description="Ray cluster for num_ranks > 1: None = start a local Ray on this machine (no dashboard, "
        "no usage stats, 1 GiB object store) and stop it at the end; `auto` or `host:port` = join a running "
        "cluster (infra/GPU.md) and leave it running.", json_schema_extra=when("distributed.num_ranks > 1")
    )
    cpus_per_rank: float = Field(
        1.0, gt=0.0, description="CPUs reserved per rank actor; Ray also sets the rank's OMP_NUM_THREADS from it.",
        json_schema_extra=when("distributed.num_ranks > 1")
    )
    gpus_per_rank: float = Field(
        0.0, ge=0.0, description="GPUs reserved per rank actor: 0 on CPU (gloo), 1 for one GPU per rank (nccl).",
        json_schema_extra=when("distributed.num_ranks > 1")
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy for the rank bundles. PACK keeps ranks on as few nodes "
        "as possible (fast collectives); STRICT_PACK requires one node; STRICT_SPREAD one rank per node. Rank 0 "
        "is always on the driver's node. A resume may change it (no step depends on it).",
        json_schema_extra=when("distributed.num_ranks > 1")
    )
    startup_timeout_s: float = Field(
        300.0, gt=0.0, description="Seconds to wait for the placement group and for every rank to load the "
        "model and join the process group.", json_schema_extra=when("distributed.num_ranks > 1")
    )


class VerifierConfig(_Strict):
    """The math verifier (ada_core/rl/rewards.py): each answer is checked in a worker process, with a hard
    5 s limit per answer."""

    step_budget_s: float | None = Field(
        600.0, gt=0.0, description="Seconds of answer checking one training step may spend, all its sampler's "
        "verify calls together (answers built to hang would cost 5 s each / workers). Answers still unchecked "
        "when it runs out score 0 with status `deadline` (metric verifier/deadline). null = no bound. "
        "Evaluation is not held to it. Ours.", json_schema_extra=ALWAYS
    )
