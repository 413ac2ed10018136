"""Parameters of the flows that sample a model without training it: evaluate (avg@k and pass@k) and curate
(pass rates to difficulty-filter a prompt set by)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from ada_core.config import ConfigError, TrainConfig, build_config, flatten_dotted
from flows.param_form import (
    Engine,
    FlowParams,
    FormJson,
    Profile,
    check_engine,
    check_overrides,
    nest_dotted,
    overrides_schema,
)


class EvaluateParams(FlowParams):
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
        from ada_core.config.applies import run_facts

        return check_engine(build_config("grpo", self.profile, overrides=overrides, facts=run_facts(curate=False)))


class CurateParams(FlowParams):
    """Difficulty-filter a prompt set with the starting model (SFT warm start included)."""

    profile: Profile = Field("tiny", description="Scale profile: model, dataset and curation defaults.")
    engine: Engine = Field("transformers", description="Rollout engine.")
    overrides: Annotated[dict[str, Any], FormJson] = Field(
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
        from ada_core.config.applies import run_facts

        return check_engine(build_config("grpo", self.profile, overrides=overrides, facts=run_facts(curate=True)))
