"""Flow parameters as pydantic models, so Prefect's UI shows a validated, documented form.

Every `overrides` key is checked when the parameters are validated (Prefect does that before the
flow body starts): a key that is no config field, a value of the wrong type, or a key the flow sets
from a field of its own (`seed`, `preset`, ...: the run's name, tags and report use that one) is
refused with the key named. A flow then builds its `TrainConfig` first thing (`build_config`), so
a bad combination fails before any model, dataset or MLflow run exists (`sampler.n: ...`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from ada_core.config import PRESETS, ConfigError, TrainConfig, build_config, flatten_dotted

Preset = Literal["grpo", "grpo-n8", "grpo-n16", "dapo", "ada-pos", "ada-balance", "ada-est", "ada-posterior",
                 "ada-budget"]
Profile = Literal["tiny", "smollm2-135m", "paper"]
Engine = Literal["transformers", "vllm"]
# Prefect refuses these characters in a concurrency limit's name.
LimitName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[^/%&><]+$")]
MATCHED_LABEL = "grpo-matched"  # compare's matched-budget GRPO control

def nest_dotted(flat: dict[str, Any]) -> dict[str, Any]:
    """`{"sampler.M": 8, "optim": {"lr": 1e-4}}` -> `{"sampler": {"M": 8}, "optim": {"lr": 1e-4}}`."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = str(key).split(".")
        if not all(parts):
            raise ConfigError(f"overrides: empty segment in key {key!r}")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"overrides: {key!r} sets a field inside {part!r}, which is also set to a value")
            node = child
        leaf = parts[-1]
        if isinstance(value, dict):
            value = nest_dotted(value)
            if isinstance(node.get(leaf), dict):
                value = {**node[leaf], **value}
        node[leaf] = value
    return out


def check_engine(config: TrainConfig) -> TrainConfig:
    """vLLM needs its own environment (`make vllm-env`) or a server to attach to; sleep mode needs CUDA."""
    from ada_core.engines.vllm_server import check_engine_config

    check_engine_config(config)
    return config


def config_field(key: str):
    """The pydantic field of TrainConfig at dotted `key`, or a ValueError saying why there is none."""
    model: type[BaseModel] = TrainConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        where = ".".join(parts[:depth]) or "the config"
        if field is None:
            known = ", ".join(sorted(model.model_fields))
            raise ValueError(f"overrides: unknown key {key!r}: {where} has no field {part!r} (its fields: {known})")
        if depth == len(parts) - 1:
            return field
        annotation = field.annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise ValueError(  # noqa: TRY004 - pydantic reports a ValueError as the field's error
                f"overrides: unknown key {key!r}: {'.'.join(parts[: depth + 1])} is a value, not a section")
        model = annotation
    raise ValueError(f"overrides: empty key {key!r}")


def check_overrides(overrides: dict[str, Any], own: dict[str, str]) -> None:
    """Refuse an override that is no config field, has the wrong type, or is set by a flow field (`own`:
    dotted key -> that field's name), naming the key."""
    for key, value in flatten_dotted(nest_dotted(overrides)).items():
        if key in own:
            raise ValueError(f"overrides: {key!r} is set by this flow's own `{own[key]}` field (the run's name, tags "
                             f"and report use that one); give it there, not in overrides")
        field = config_field(key)
        annotation = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
        try:
            TypeAdapter(annotation).validate_python(value)
        except ValidationError as err:
            problem = "; ".join(e["msg"] for e in err.errors())
            raise ValueError(f"overrides: {key!r}: {problem} (got {value!r})") from None


def override_keys(exclude: dict[str, str] | None = None) -> list[str]:
    """Every dotted key `overrides` may name (each field and each section of TrainConfig), less `exclude`."""
    keys: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            keys.append(prefix + name)
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                walk(field.annotation, f"{prefix}{name}.")

    walk(TrainConfig, "")
    return sorted(k for k in keys if k not in (exclude or {}))


# Config fields every training-type flow sets from a field of its own.
RUN_OWN_FIELDS = {"preset": "preset", "profile": "profile", "seed": "seed", "steps": "steps",
                  "prompts_per_step": "prompts_per_step", "rollout.engine": "engine"}


def overrides_schema(exclude: dict[str, str]) -> dict[str, Any]:
    """JSON schema of `overrides` beyond `object`: its keys, so the Prefect server refuses a flow run
    with an unknown key when the run is created (deployments enforce their parameter schema)."""
    return {"propertyNames": {"enum": override_keys(exclude)}}


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunSettings(_Params):
    """What every training-type flow shares: scale, engine, free overrides and where to track."""

    profile: Profile = Field("tiny", description="Scale profile: prompts per step, lengths and lr for a model size.")
    engine: Engine = Field("transformers", description="Rollout engine (config rollout.engine): transformers in-process, or a vLLM server from `make vllm-env`.")
    steps: int | None = Field(None, ge=1, description="Training steps; empty = the profile's.")
    prompts_per_step: int | None = Field(None, ge=1, description="Prompts per step (B); empty = the profile's.")
    overrides: dict[str, Any] = Field(
        {},
        description="Any config field by dotted name, e.g. {\"sampler.M\": 8, \"optim.lr\": 1e-4, \"sft_steps\": 50}. "
        "Fields this form has (seed, preset, steps, ...) are set there, not here.",
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
        merged = nest_dotted({**flatten_dotted(top), **flatten_dotted(overrides), **flatten_dotted(extra or {})})
        return check_engine(build_config(preset, self.profile, overrides=merged, refuse_unread=not group))

    def shared_overrides_for(self, config: TrainConfig) -> dict[str, Any]:
        """The group's overrides (dotted) that a child of `config` reads: a group's `sampler.M` goes to its Ada
        variants, not to GRPO, which would refuse it."""
        from ada_core.config.applies import not_applicable

        unread = not_applicable(config)
        return {k: v for k, v in flatten_dotted(nest_dotted(self.overrides)).items() if k not in unread}

    def check_shared_overrides(self, configs: list[TrainConfig]) -> None:
        """Refuse a group override that none of its children reads, naming where it applies."""
        from ada_core.config.applies import applicability, not_applicable

        unread = set.intersection(*(not_applicable(c) for c in configs)) if configs else set()
        rules = applicability(TrainConfig)
        for key in flatten_dotted(nest_dotted(self.overrides)):
            if key in unread:
                raise ConfigError(f"overrides.{key}: no run of this group reads it: it applies only when "
                                  f"{rules[key]}; remove it or add a variant that reads it")


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
        for name in ("preset", "profile", "seed", "steps", "prompts_per_step"):
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
        ["grpo", "ada-pos", "ada-balance"], min_length=1, description="Presets to compare."
    )
    matched_grpo: bool = Field(
        True,
        description="Add GRPO with prompts_per_step sized to generate as many samples per step as Ada-balance "
        "(needs ada-balance in variants).",
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


class EvaluateParams(_Params):
    """avg@k and pass@k of a registered model, a run artifact or a local checkpoint."""

    model: str = Field(
        "models:/ada-policy@champion",
        description="`models:/<name>@<alias>`, `models:/<name>/<version>`, `runs:/<id>/<path>`, a checkpoint folder "
        "(step_N with hf/ inside), an HF model folder, or a hub id `org/name[@revision]`.",
    )
    k: int | None = Field(None, ge=1, description="Samples per prompt; empty = the suite's (32 for paper), else the profile's.")
    suite: Literal["paper"] | None = Field(
        None, description="Also score a named benchmark suite by hub id and report it as the paper's accuracy table: "
        "paper = MATH500, Minerva Math, OlympiadBench, AIME-like (avg@32, temperature 1.0, 4096 tokens).",
    )
    max_tokens: int | None = Field(None, ge=1, description="Generated-token limit; empty = the suite's, else the profile's.")
    profile: Profile = Field("tiny", description="Scale profile for lengths and eval set size.")
    engine: Engine = Field("transformers", description="Rollout engine.")
    dataset: str | None = Field(
        None, description="Eval prompts: generator name or file (its held-out split). Empty = for a model the "
        "platform trained, that run's own held-out split; else the profile's dataset.")
    eval_size: int | None = Field(
        None, ge=1, description="Held-out prompts; empty = all of them (the training run's, or the profile's).")
    temperature: float | None = Field(None, gt=0, description="Sampling temperature; empty = the suite's or the profile's (1.0).")
    seed: int = Field(0, description="Seed of the prompt split and the samples; a platform-trained model's run "
                      "brings its own.")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (see train).")
    experiment: str = Field("reinforce-ada", min_length=1, description="MLflow experiment name.")

    def config(self, model_dir: str) -> TrainConfig:
        data: dict[str, Any] = {}
        if self.dataset is not None:
            data["dataset"] = self.dataset
        if self.eval_size is not None:
            data["eval_size"] = self.eval_size
        overrides: dict[str, Any] = {
            "model": model_dir, "sft_steps": 0, "seed": self.seed, "steps": 1,
            "prompts_per_step": 1,  # it trains on none: a small eval file must not fail the prompts-per-step check
            "rollout": {"engine": self.engine}, "data": data, "ledger": {"enabled": False},  # no training steps
        }
        for key, value in (("eval_k", self.k), ("eval_max_tokens", self.max_tokens),
                           ("eval_temperature", self.temperature)):
            if value is not None:
                overrides[key] = value
        if self.suite is not None:
            from ada_core.data.suites import suite_overrides

            overrides.update(suite_overrides(self.suite, self.k, self.max_tokens, self.temperature))
        return check_engine(build_config("grpo", self.profile, overrides=overrides))


class CurateParams(_Params):
    """Difficulty-filter a prompt set with the starting model (SFT warm start included)."""

    profile: Profile = Field("tiny", description="Scale profile: model, dataset and curation defaults.")
    engine: Engine = Field("transformers", description="Rollout engine.")
    overrides: dict[str, Any] = Field(
        {},
        description="Config fields by dotted name, e.g. {\"data.curation_k\": 16, \"data.pass_rate_ceiling\": 0.3125}.",
        json_schema_extra=overrides_schema({"preset": "", "profile": "", "seed": "", "rollout.engine": ""}),
    )
    seed: int = Field(0, description="Seed of the prompt pool and the curation samples.")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI (see train).")
    experiment: str = Field("reinforce-ada", min_length=1, description="MLflow experiment name.")

    OWN_FIELDS: ClassVar[dict[str, str]] = {"preset": "(curation always samples with grpo's settings)",
                                            "profile": "profile", "seed": "seed", "rollout.engine": "engine"}

    @model_validator(mode="after")
    def _overrides_are_config_fields(self) -> CurateParams:
        try:
            check_overrides(self.overrides, type(self).OWN_FIELDS)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self

    def config(self) -> TrainConfig:
        top = {"seed": self.seed, "rollout.engine": self.engine}
        overrides = nest_dotted({**top, **flatten_dotted(nest_dotted(self.overrides))})
        return check_engine(build_config("grpo", self.profile, overrides=overrides))
