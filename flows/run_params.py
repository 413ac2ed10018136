"""Parameters of the training-type flows: one run (`TrainParams`) and a group of runs (compare, sweep).

`RunSettings` is what they share: scale, engine, free overrides and tracking; `build` makes the run's
TrainConfig from them. `GroupSettings` adds how a group runs its children (flows/fanout.py).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from ada_core.config import PRESETS, ConfigError, TrainConfig, build_config, flatten_dotted
from ada_core.config.registry import reads_option
from flows.param_form import (
    Engine,
    FlowParams,
    FormJson,
    LimitName,
    Preset,
    Profile,
    by_profile,
    check_engine,
    check_overrides,
    nest_dotted,
    overrides_schema,
)

MATCHED_LABEL = "grpo-matched"  # compare's matched-budget GRPO control

# Config fields every training-type flow sets from a field of its own.
RUN_OWN_FIELDS = {"preset": "preset", "profile": "profile", "seed": "seed", "steps": "steps",
                  "prompts_per_step": "prompts_per_step", "rollout.engine": "engine"}


class RunSettings(FlowParams):
    """What every training-type flow shares: scale, engine, free overrides and where to track."""

    profile: Profile = Field("tiny", description="Scale profile: prompts per step, lengths and lr for a model size.")
    engine: Engine = Field("transformers", description="Rollout engine (config rollout.engine): transformers in-process, or a vLLM server from `make vllm-env`.")
    steps: int | None = Field(None, ge=1, description=f"Training steps; empty = the profile's: {by_profile('steps')}.")
    prompts_per_step: int | None = Field(
        None, ge=1, description=f"Prompts per step (B); empty = the profile's: {by_profile('prompts_per_step')}.")
    eval_every: int | None = Field(
        None, ge=0, description="Evaluate on the held-out prompts every this many steps (and at step 0 and the last); "
        "0 = never. A curve has about steps / eval_every + 1 points: a 30-step run at 20 has three. Empty = the "
        f"profile's: {by_profile('eval_every')}. (overrides.eval_every, as before, is the same field: give one.)")
    overrides: Annotated[dict[str, Any], FormJson] = Field(
        {},
        description="Any config field by dotted name, e.g. {\"sampler.M\": 8, \"optim.lr\": 1e-4, \"sft_steps\": 50}; "
        "every key with its default and meaning: docs/CONFIG.md. An unknown key is refused when the run is created "
        "(the server's message names it). Fields this form has (seed, preset, steps, ...) are set there, not here.",
        json_schema_extra=overrides_schema(RUN_OWN_FIELDS),
    )
    curate: bool = Field(True, description="Difficulty-filter the prompts with the starting model before training.")
    curation_seed: int = Field(0, description="Seed of the curation pool and its samples; shared by all seeds of a comparison.")
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; empty = $MLFLOW_TRACKING_URI, the `make ui` server, or $ADA_HOME/mlflow.db."
    )
    experiment: str = Field("reinforce-ada", min_length=1, description="MLflow experiment name.")

    # Config fields these parameters set themselves: an override of one would disagree with the field.
    OWN_FIELDS: ClassVar[dict[str, str]] = RUN_OWN_FIELDS

    @model_validator(mode="after")
    def _overrides_are_config_fields(self) -> RunSettings:
        try:
            check_overrides(self.overrides, type(self).OWN_FIELDS)
        except ConfigError as err:  # nest_dotted's own complaint (a key both a value and a section)
            raise ValueError(str(err)) from None
        if self.eval_every is not None and "eval_every" in self.overrides:
            raise ValueError(f"eval_every: given twice, {self.eval_every} in the field and "
                             f"{self.overrides['eval_every']} in overrides; give it in one place")
        return self

    def build(self, preset: str, seed: int, extra: dict[str, Any] | None = None, group: bool = False) -> TrainConfig:
        """The validated TrainConfig; raises ConfigError naming the field. `group`: `overrides` are a group's,
        shared by variants that may not all read each (`shared_overrides_for` keeps a child's own)."""
        overrides = nest_dotted(self.overrides)
        top: dict[str, Any] = {"seed": seed, "rollout": {"engine": self.engine}}
        if self.steps is not None:
            top["steps"] = self.steps
        if self.prompts_per_step is not None:
            top["prompts_per_step"] = self.prompts_per_step
        if self.eval_every is not None:
            top["eval_every"] = self.eval_every
        if group:  # a comparison's seeds share their start and their exam (DataConfig.seed)
            top["data"] = {"seed": GROUP_DATA_SEED}
        shared = flatten_dotted(overrides)
        if group:  # a registered sampler's options go to the variants whose sampler has them
            sampler = {**PRESETS.get(preset, {}).get("sampler", {}), **overrides.get("sampler", {})}.get("name", "fixed")
            shared = {k: v for k, v in shared.items() if not k.startswith("sampler.options.")
                      or reads_option(sampler, k.removeprefix("sampler.options."))}
        merged = nest_dotted({**flatten_dotted(top), **shared, **flatten_dotted(extra or {})})
        return check_engine(build_config(preset, self.profile, overrides=merged, refuse_unread=not group,
                                         facts=self.facts()))

    def facts(self) -> dict[str, Any]:
        """The run facts of a run of these settings (ada_core/config/applies.py): whether it curates first."""
        from ada_core.config.applies import run_facts

        return run_facts(self.curate)

    def shared_overrides_for(self, config: TrainConfig) -> dict[str, Any]:
        """The group's overrides (dotted) that a child of `config` reads: a group's `sampler.M` goes to its Ada
        variants, not to GRPO, which would refuse it."""
        from ada_core.config.applies import not_applicable

        unread = not_applicable(config, self.facts())
        return {k: v for k, v in flatten_dotted(nest_dotted(self.overrides)).items() if k not in unread and not (
            k.startswith("sampler.options.") and not reads_option(config.sampler.name, k.removeprefix("sampler.options.")))}

    def check_shared_overrides(self, configs: list[TrainConfig]) -> None:
        """Refuse a group override that none of its children reads, naming where it applies."""
        from ada_core.config.applies import applicability, not_applicable

        facts = self.facts()
        unread = set.intersection(*(not_applicable(c, facts) for c in configs)) if configs else set()
        rules = applicability(TrainConfig)
        for key in flatten_dotted(nest_dotted(self.overrides)):
            if key.startswith("sampler.options.") and not any(
                    reads_option(c.sampler.name, key.removeprefix("sampler.options.")) for c in configs):
                raise ConfigError(f"overrides.{key}: no run of this group reads it: no sampler of its variants "
                                  f"({', '.join(sorted({c.sampler.name for c in configs}))}) has that option")
            if key in unread:
                raise ConfigError(f"overrides.{key}: no run of this group reads it: it applies only when "
                                  f"{rules[key]}; remove it or add a variant that reads it")


# The data seed of a group's children unless its overrides give one: every seed and variant of a compare or sweep
# draws the same split, warm start and evaluation samples, and the seed moves RL's randomness only.
GROUP_DATA_SEED = 0


class TrainParams(RunSettings):
    """One training run of one variant."""

    preset: Preset = Field("ada-balance", description="Algorithm preset: grpo, grpo-n8, grpo-n16, dapo, ada-pos, "
                          "ada-balance, ada-est (the paper's Est), ada-posterior or ada-budget.")
    seed: int = Field(0, description="Training seed (data order, sampling, initialisation).")
    variant: str | None = Field(
        None, description="Variant name for params, reports and registry tags (e.g. grpo-matched); empty = preset."
    )
    run_name: str | None = Field(None, description="MLflow run name; empty = `train-<variant>-s<seed>-<time stamp>` (the flow run gets the same name).")
    parent_run_id: str | None = Field(None, description="Log as a child of this MLflow run (set by compare and sweep).")
    register_as: str | None = Field(
        None, description="Register the final checkpoint in the Model Registry under this name."
    )
    alias: str = Field("candidate", min_length=1, description="Alias for the registered version ('latest' is reserved).")
    output_dir: str | None = Field(
        None, description="Run directory; empty = `$ADA_HOME/runs/<run name>`. A folder that already holds a "
                          "run is refused unless overwrite is set."
    )
    overwrite: bool = Field(
        False, description="Start afresh in an output_dir that holds a run, moving the old run aside to "
                           "`<dir>.replaced-<time>` (it is never deleted)."
    )
    resume: str | None = Field(
        None, description="Continue a crashed or stopped run: its run folder or MLflow run id. Same folder, same "
        "MLflow run, from its newest good checkpoint (output_dir is ignored). Give the run's other values unchanged.",
    )
    concurrency_limits: list[LimitName] = Field(
        [],
        description="Prefect global concurrency limits this run holds one slot of from before its MLflow run "
        "starts until it ends (set by compare and sweep with children='deployments'); each must exist.",
    )

    def config(self) -> TrainConfig:
        return self.build(self.preset, self.seed)

    def resume_overrides(self) -> dict[str, Any]:
        """What these parameters set explicitly about the config, nested: on a resume, each is checked
        against the run's own config (ada_core/run/resume.py), and what was left out keeps the run's value."""
        given = self.model_fields_set
        top: dict[str, Any] = {}
        for name in ("preset", "profile", "seed", "steps", "prompts_per_step", "eval_every"):
            if name in given and getattr(self, name) is not None:
                top[name] = getattr(self, name)
        if "engine" in given:
            top["rollout.engine"] = self.engine
        return nest_dotted({**top, **flatten_dotted(nest_dotted(self.overrides))})


class GroupSettings(RunSettings):
    """How a group (compare, sweep) runs its children; see flows/fanout.py."""

    OWN_FIELDS: ClassVar[dict[str, str]] = {**RunSettings.OWN_FIELDS, "preset": "variants", "seed": "seeds"}

    children: Literal["inline", "deployments"] = Field(
        "inline",
        description="inline: each child is a `train` subflow in this process, one after another (the embedded "
        "default: no server or worker needed). deployments: every child is a run of the `train` deployment, "
        "submitted at once and picked up by workers on its work pool (`make ui`); how many train together is "
        "bounded by `concurrency_limit` and `max_parallel`.",
    )
    max_parallel: int | None = Field(
        None, ge=1,
        description="deployments: at most this many of this group's children train at once (a concurrency limit "
        "of the group's own, created for it and deleted after); empty = bounded by `concurrency_limit` and the "
        "workers only. Inline children always run one at a time.",
    )
    concurrency_limit: LimitName | None = Field(
        "ada-train",
        description="deployments: the Prefect global concurrency limit every child holds a slot of while it "
        "trains, shared by all groups (its size = runs training at once; `make ui` creates it with "
        "$ADA_TRAIN_SLOTS slots, default $ADA_WORKERS). Must exist; empty = none.",
    )
    deployment: str = Field(
        "train/train", min_length=3, description="deployments: the `<flow>/<deployment>` each child runs as."
    )
    poll_s: float = Field(2.0, gt=0, le=60, description="deployments: seconds between checks of the children's states.")


class CompareParams(GroupSettings):
    """GRPO against Ada variants over seeds, plus an optional matched-budget GRPO control."""

    variants: list[Preset] = Field(
        ["grpo", "ada-balance"], min_length=1, description="Presets to compare: each is one arm (GRPO against "
        "Ada-balance unless you add more)."
    )
    matched_grpo: bool = Field(
        False,
        description="Add one more arm: GRPO with prompts_per_step sized to generate as many samples per step as "
        "Ada-balance (needs ada-balance in variants).",
    )
    controls: list[Preset] = Field(
        [], description="Variants that get budget-matched GRPO controls, each started once the variant's run of a "
        "seed ends, with as many updates (steps) as it: `grpo-b.<variant>` = GRPO n = 4 over as many prompts a "
        "step as generate its samples a step, `grpo-n.<variant>` = GRPO at n = its samples a prompt (rounded) "
        "over its prompts. A control that is already a variant of the group (n = 8 is grpo-n8) is read from "
        "that run, not run twice.",
    )
    seeds: list[int] = Field([0], min_length=1, description="Training seeds.")
    regimes: list[Literal["default", "pool", "fresh"]] = Field(
        ["default"], min_length=1,
        description="Data regimes, each run for every variant and seed: `default` = the data as configured; "
        "`pool` = a fixed pool of `pool_prompts` training prompts reused over epochs (the paper's regime); "
        "`fresh` = every training prompt (steps x prompts_per_step must fit, so none repeats). Labels get the "
        "regime as a prefix (`pool-grpo`) unless it is `default`.",
    )
    pool_prompts: int = Field(256, ge=1, description="pool regime: training prompts reused over epochs (data.train_pool).")
    reference: str = Field(
        "grpo", min_length=1,
        description=f"The variant every other is paired against in the report (Table C): one of `variants`, or "
        f"`{MATCHED_LABEL}` with matched_grpo.",
    )
    register_as: str = Field("ada-policy", min_length=1, description="Registered model name for the best policy.")
    alias: str = Field("champion", min_length=1, description="Alias pointed at the best policy's version.")
    resume: str | None = Field(
        None, description="Continue a crashed group: its folder or parent MLflow run id. Finished children are "
        "skipped, the others resume from their last good checkpoint. Give the group's other values unchanged.",
    )

    @model_validator(mode="after")
    def _matched_needs_reference(self) -> CompareParams:
        if self.matched_grpo and "ada-balance" not in self.variants:
            raise ValueError("matched_grpo: needs 'ada-balance' in variants (its samples per step set the budget)")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"variants: each preset once, got {self.variants}")
        stray = [c for c in self.controls if c not in self.variants]
        if stray:
            raise ValueError(f"controls: {stray} are not among the variants {self.variants}: a control is sized "
                             "from its variant's run")
        if len(set(self.regimes)) != len(self.regimes):
            raise ValueError(f"regimes: each regime once, got {self.regimes}")
        # The report pairs by label; a reference no child carries leaves Table C empty without a word.
        labels = [*self.variants, MATCHED_LABEL] if self.matched_grpo else self.variants
        if self.reference not in labels:
            raise ValueError(f"reference: {self.reference!r} is not one of the runs {labels}; add it to variants or "
                             "pair against one of them")
        return self


class SweepParams(GroupSettings):
    """A grid over N, M, n, variant and seed; GRPO-type variants vary only n."""

    OWN_FIELDS: ClassVar[dict[str, str]] = {**GroupSettings.OWN_FIELDS, "sampler.N": "N", "sampler.M": "M",
                                            "sampler.n": "n"}

    variants: list[Preset] = Field(["ada-balance"], min_length=1, description="Presets.")
    N: list[int] = Field([2, 4], min_length=1, description="ada: max rounds.")
    M: list[int] = Field([4, 8], min_length=1, description="ada: samples per round.")
    n: list[int] = Field([4], min_length=1, description="Final group size.")
    seeds: list[int] = Field([0], min_length=1, description="Training seeds.")
    register_as: str = Field("ada-policy", min_length=1, description="Registered model name for the best policy.")
    alias: str = Field("champion", min_length=1, description="Alias pointed at the best policy's version.")
    resume: str | None = Field(
        None, description="Continue a crashed group: its folder or parent MLflow run id. Finished children are "
        "skipped, the others resume from their last good checkpoint. Give the group's other values unchanged.",
    )

    def grid(self) -> list[tuple[str, str, dict[str, Any]]]:
        """`(preset, label, sampler overrides)` for every point; fixed-size samplers skip N and M.

        variants [ada-balance, grpo], N [2, 4], M [4], n [4] ->
        ada-balance-N2-M4-n4, ada-balance-N4-M4-n4, grpo-n4
        """
        points = []
        for preset in self.variants:
            if PRESETS[preset]["sampler"]["name"] == "ada":
                for N in self.N:
                    for M in self.M:
                        for n in self.n:
                            points.append((preset, f"{preset}-N{N}-M{M}-n{n}", {"sampler": {"N": N, "M": M, "n": n}}))
            else:
                for n in self.n:
                    points.append((preset, f"{preset}-n{n}", {"sampler": {"n": n}}))
        return points
