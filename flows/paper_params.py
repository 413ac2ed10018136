"""The paper grid (methods x seeds x pools, by scale profile) and the `paper-tables` flow's parameters."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ada_core.config import ConfigError
from flows.param_form import (
    FlowParams,
    FormJson,
    Preset,
    by_profile,
    check_overrides,
    form_json_schema,
    overrides_schema,
)
from flows.run_params import CompareParams


# The paper grid by scale profile: the `paper-tables` form's defaults and benchmarks/paper_tables.py's. Both pools
# come from the same raw `a+b=` prompts and the same SFT start, so they differ only by the filter.
# - testbed (the default; docs/benchmarks/testbed.md): the profile's own sizes and band (1-5 correct of 16),
#   fresh prompts every step, 1,024 held out and 256 for validation; hard = 1-2 correct of 16; revisit = the
#   standard band over a fixed pool of 640 training prompts, 5 epochs; 5 seeds.
# - tiny (docs/benchmarks/paper-tables.md): 8,192 raw prompts, 512 held out, a fixed pool of 256 reused over
#   epochs as in the paper; standard = the tiny curation (k 8, 0 < p <= 0.875); 3 seeds.
PAPER_METHODS = ["grpo", "grpo-n8", "grpo-n16", "dapo", "ada-pos", "ada-balance", "ada-est"]
# The methods whose samples a step differ from GRPO n = 4's: each gets budget-matched GRPO controls (CompareParams.controls).
# ada-v3w (a research sampler, ada_core/sampling/research.py) spends Ada's samples; knapsack and pilot spend
# GRPO n = 4's B x n exactly (grpo is their control), greso at most that.
PAPER_ADAPTIVE = ["dapo", "ada-pos", "ada-balance", "ada-est", "ada-v3w"]
PAPER_RAW_POOL = 8192  # the tiny grid's raw prompts; the hard filter keeps enough of it
PAPER_HELD_OUT = 512
REVISIT_POOL = 640  # the testbed's revisit pool: 640 curated training prompts, 5 epochs in 100 steps of 32
# The testbed's curation bands (the pools that curate differently; `revisit` trains on the standard band's set):
# the shipped start (ada_core/data/shipped/testbed) holds each one's curated, held-out and validation ids.
TESTBED_BANDS = {"standard": {}, "hard": {"data.keep_pass_rate": [1 / 16, 2 / 16]}}
PAPER_GRIDS: dict[str, dict[str, Any]] = {
    "testbed": {
        "seeds": [0, 1, 2, 3, 4],
        "overrides": {"checkpoint_every": 0},  # only the final checkpoint: a killed run reruns
        # revisit: the standard band, a fixed pool of 640 training prompts reused for 5 epochs (100 x 32 draws), as
        # the paper's pool is: the regime where a prompt's history (Est's EMA, the budgeted samplers) has visits.
        "pools": {**TESTBED_BANDS, "revisit": {"data.train_pool": REVISIT_POOL}},
    },
    "tiny": {
        "seeds": [0, 1, 2],
        "overrides": {
            "data.train_size": PAPER_RAW_POOL - PAPER_HELD_OUT,
            "data.eval_size": PAPER_HELD_OUT,
            "data.train_pool": 256,
            "eval_k": 4,
            "eval_every": 10,
            "checkpoint_every": 0,
        },
        "pools": {
            "standard": {},  # the tiny profile's curation: k = 8, 0 < pass rate <= 0.875
            "hard": {"data.curation_k": 16, "data.keep_pass_rate": [1 / 16, 2 / 16]},  # 1-2 correct of 16
        },
    },
}
PAPER_PROFILE = "testbed"
PAPER_SEEDS = PAPER_GRIDS[PAPER_PROFILE]["seeds"]
PAPER_OVERRIDES = PAPER_GRIDS[PAPER_PROFILE]["overrides"]
PAPER_POOLS = PAPER_GRIDS[PAPER_PROFILE]["pools"]
PAPER_OWN_FIELDS = {"preset": "methods", "seed": "seeds", "steps": "steps", "prompts_per_step": "prompts_per_step"}


class PaperTablesParams(FlowParams):
    """The paper's grid: `methods` x `seeds` on every pool, one `compare` per pool, then Tables A-D."""

    profile: Literal["testbed", "tiny"] = Field(
        PAPER_PROFILE, description="Scale profile and its grid: testbed (the calibrated testbed, 5 seeds) or tiny (the "
        "earlier grid, 3 seeds, a fixed pool of 256). Seeds, pools and overrides left out of a request are its grid's.")
    methods: list[Preset] = Field(PAPER_METHODS, min_length=1, description="Presets, each trained on every pool "
                                  "and seed; Tables B-D read them against grpo (which must be one).")
    seeds: list[int] = Field(PAPER_SEEDS, min_length=1, description="Training seeds.")
    pools: Annotated[dict[str, dict[str, Any]], FormJson] = Field(
        PAPER_POOLS, min_length=1, json_schema_extra=form_json_schema(),
        description="Pool name -> its config overrides (dotted), on top of `overrides`: standard = the profile's "
        "curation, hard = the paper's 1-2 correct of 16. Each pool is one compare run.")
    steps: int | None = Field(None, ge=1, description=f"Training steps; empty = the profile's: {by_profile('steps')}.")
    prompts_per_step: int | None = Field(
        None, ge=1, description=f"Prompts per step (B); empty = the profile's: {by_profile('prompts_per_step')}.")
    overrides: Annotated[dict[str, Any], FormJson] = Field(
        PAPER_OVERRIDES, description="Config fields by dotted name, shared by every pool (the paper grid's sizes).",
        json_schema_extra=overrides_schema(PAPER_OWN_FIELDS),
    )
    controls: bool = Field(
        True, description="Budget-matched GRPO controls for every adaptive method of `methods` (dapo, ada-pos, "
        "ada-balance, ada-est, ada-v3w): GRPO n = 4 over as many prompts a step as match its samples, and GRPO at n = its "
        "samples a prompt, each with its number of updates, so Table C compares at equal samples and updates.")
    curate: bool = Field(True, description="Difficulty-filter each pool's prompts with the starting model (the "
                         "pools are filters: off, both train on the raw prompts).")
    experiment: str = Field("paper-tables", min_length=1, description="MLflow experiment name.")
    resume: Annotated[dict[str, str], FormJson] = Field(
        {}, json_schema_extra=form_json_schema(), description="Continue a killed grid: pool name -> its compare group folder (the log names them); "
        "finished children are skipped.")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (see train).")

    @model_validator(mode="before")
    @classmethod
    def _grid_of_the_profile(cls, data: Any) -> Any:
        """Seeds, pools and overrides not given are the chosen profile's grid (PAPER_GRIDS)."""
        if isinstance(data, dict) and data.get("profile") in PAPER_GRIDS:
            grid = PAPER_GRIDS[data["profile"]]
            data = {**{key: grid[key] for key in ("seeds", "pools", "overrides")}, **data}
        return data

    @model_validator(mode="after")
    def _check(self) -> PaperTablesParams:
        if "grpo" not in self.methods:
            raise ValueError("methods: the tables read every method against grpo; add it")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods: each preset once, got {self.methods}")
        unknown = set(self.resume) - set(self.pools)
        if unknown:
            raise ValueError(f"resume: no pool named {sorted(unknown)}; pools are {sorted(self.pools)}")
        try:
            check_overrides(self.overrides, PAPER_OWN_FIELDS)
            for pool, overrides in self.pools.items():
                try:
                    check_overrides(overrides, PAPER_OWN_FIELDS)
                except ValueError as err:
                    raise ValueError(f"pools.{pool}: {err}") from None
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self

    def compare_params(self, pool: str) -> CompareParams:
        """The pool's `compare`: every method and seed, the adaptive ones' budget-matched controls, paired against grpo."""
        return CompareParams(
            profile=self.profile, variants=self.methods, seeds=self.seeds, matched_grpo=False, reference="grpo", steps=self.steps,
            controls=[m for m in self.methods if m in PAPER_ADAPTIVE] if self.controls else [],
            prompts_per_step=self.prompts_per_step, overrides={**self.overrides, **self.pools[pool]},
            curate=self.curate, experiment=self.experiment, resume=self.resume.get(pool),
            tracking_uri=self.tracking_uri,
        )
