"""Typed configs: the pydantic schema every entry point validates against.

One schema serves the CLI (`--set sampler.M=8`), YAML config files and Prefect's UI forms, so every
field carries a description: what it controls, its units, and where its default comes from
(`paper` = arXiv 2510.04996, `ref` = the public `run_reinforce_ada.sh`, `ours` = our choice).
The presets and profiles that fill it are in presets.py.

This module holds the root, `TrainConfig` (its own fields, then its sections in the order the docs
list them, and the checks across sections), and the helpers that validate, flatten and log a config. The
sections live by kind: algorithm.py (sampler, advantage, loss, optim), rollout.py (rollout, rollout.vllm),
run_sections.py (data, sft, ledger, checkpoint, distributed, verifier); each is re-exported here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from ada_core.config.algorithm import AdvantageConfig, LossConfig, OptimConfig, SamplerConfig
from ada_core.config.applies import ALWAYS, LABEL, when
from ada_core.config.rollout import RolloutConfig, VLLMConfig
from ada_core.config.run_sections import (
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    LedgerConfig,
    SftConfig,
    VerifierConfig,
)
from ada_core.config.strict import _Strict
from ada_core.errors import ConfigError

__all__ = [
    "AdvantageConfig", "CheckpointConfig", "ConfigError", "DataConfig", "DistributedConfig", "LedgerConfig",
    "LossConfig", "OptimConfig", "RolloutConfig", "SamplerConfig", "SftConfig", "TrainConfig", "VLLMConfig",
    "VerifierConfig", "data_seed", "flat_params", "flatten_dotted", "format_validation_error", "validate_config",
]

_PINNED_HUB_ID = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)@[0-9a-f]{40}")


def data_seed(config: "TrainConfig") -> int:
    """The seed that draws a run's data, its SFT warm start and its evaluation samples: `data.seed`, else `seed`."""
    return config.seed if config.data.seed is None else config.data.seed


class TrainConfig(_Strict):
    """Everything one training run needs. Build with `build_config`, not by hand."""

    preset: str = Field("grpo", description="Algorithm preset this config started from.", json_schema_extra=LABEL)
    profile: str = Field("tiny", description="Scale profile this config started from.", json_schema_extra=LABEL)
    model: str = Field(
        "tiny", description="`tiny`, `smollm2-135m`, a local HF model folder, or a hub id org/name[@revision] "
        "(runs log it pinned to its commit).", json_schema_extra=ALWAYS,
    )
    seed: int = Field(0, description="Seeds data order, sampling and initialisation.", json_schema_extra=ALWAYS)
    steps: int = Field(400, ge=1, description="Training steps. Ref: 400; paper: 600.", json_schema_extra=ALWAYS)
    prompts_per_step: int = Field(512, ge=1, description="Prompts per step (B). Ref: 512.", json_schema_extra=ALWAYS)
    eval_every: int = Field(10, ge=0, description="Evaluate every E steps; 0 = never.", json_schema_extra=ALWAYS)
    eval_k: int = Field(4, ge=1, description="Samples per eval prompt for avg@k / pass@k. Paper: 32.",
                        json_schema_extra=when("eval_every > 0"))
    eval_temperature: float = Field(1.0, gt=0.0, description="Eval sampling temperature. Paper: 1.0.",
                                    json_schema_extra=when("eval_every > 0"))
    eval_max_tokens: int | None = Field(
        None, ge=1, description="Generated-token limit per evaluation sample; None = rollout.max_tokens. Paper: 4096.",
        json_schema_extra=when("eval_every > 0"),
    )
    eval_suite: Literal["paper"] | None = Field(
        None,
        description="Benchmarks scored at every evaluation besides the held-out split, by hub id "
        "(ada_core/data/suites.py): `paper` = MATH500, Minerva Math, OlympiadBench and the AIME-like set, "
        "avg@eval_k each and their prompt-weighted average. None = the held-out split only. Ours: None.",
        json_schema_extra=when("eval_every > 0"),
    )
    eval_suite_revisions: list[str] = Field(
        [],
        description="The eval_suite's benchmarks pinned to commits (`org/name@<commit>`, one per benchmark): a run "
        "fills in those not given when it starts, as it pins model and data.dataset, so config.yaml and the run's "
        "MLflow dataset inputs record the revisions it scores and a resume scores the same. Give them to score "
        "fixed revisions; empty = each benchmark at the hub's main when the run starts.",
        json_schema_extra=when("eval_every > 0", "eval_suite != null"),
    )
    checkpoint_every: int = Field(50, ge=0, description="Checkpoint every C steps; 0 = only at the end.",
                                  json_schema_extra=ALWAYS)
    sft_steps: int = Field(0, ge=0, description="SFT warm-start steps before RL (tiny model). Ours.",
                           json_schema_extra=ALWAYS)
    sft: SftConfig = Field(default_factory=SftConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)

    @model_validator(mode="after")
    def _suite_revisions_are_pins(self) -> "TrainConfig":
        """The form of each entry; that each names a benchmark of the suite is checked where the suite is read
        (ada_core/data/suites.py `pin_benchmarks`: the config layer knows no suite)."""
        if not self.eval_suite_revisions:
            return self
        if self.eval_suite is None:
            raise ValueError("eval_suite_revisions pins the benchmarks of eval_suite, and eval_suite is null")
        repos = []
        for text in self.eval_suite_revisions:
            match = _PINNED_HUB_ID.fullmatch(text)
            if match is None:
                raise ValueError(f"eval_suite_revisions: {text!r} is not a hub id pinned to a commit (org/name@<40 hex>)")
            repos.append(match["repo"])
        twice = sorted({r for r in repos if repos.count(r) > 1})
        if twice:
            raise ValueError(f"eval_suite_revisions: {twice[0]} is pinned twice")
        return self

    @model_validator(mode="after")
    def _sft_draw_needs_arithmetic(self) -> "TrainConfig":
        if self.sft_steps == 0 or re.fullmatch(r"arithmetic(:\d+)?", self.data.dataset):
            return self
        if self.sft.carry_slip > 0:
            raise ValueError(f"sft.carry_slip: {self.sft.carry_slip} drops carries of `a+b=` sums; data.dataset is "
                             f"{self.data.dataset!r}, not arithmetic: use sft.carry_slip: 0")
        if self.sft.prompts is not None:
            raise ValueError(f"sft.prompts: {self.sft.prompts} independent draws need the arithmetic generator; "
                             f"data.dataset is {self.data.dataset!r}: use sft.prompts: null")
        return self

    @model_validator(mode="after")
    def _est_budget_fits(self) -> "TrainConfig":
        s = self.sampler
        if s.name == "est":
            budget = s.budget if s.budget is not None else self.prompts_per_step * s.n
            low, high = self.prompts_per_step * s.est_min, self.prompts_per_step * s.est_max
            if not low <= budget <= high:
                raise ValueError(f"sampler.budget: {budget} samples a step cannot be spread over prompts_per_step = "
                                 f"{self.prompts_per_step} prompts within [sampler.est_min, sampler.est_max] = "
                                 f"[{s.est_min}, {s.est_max}] each (needs {low}..{high})")
        return self

    @model_validator(mode="after")
    def _streaming_needs_vllm(self) -> "TrainConfig":
        if self.sampler.schedule == "streaming" and self.rollout.engine != "vllm":
            raise ValueError(f"sampler.schedule: 'streaming' needs rollout.engine: vllm (per-sample requests with "
                             f"abort); rollout.engine={self.rollout.engine!r} serves only schedule: rounds")
        return self

    @model_validator(mode="after")
    def _async_needs_a_server(self) -> "TrainConfig":
        k = self.rollout.async_steps
        if k == 0:
            return self
        if self.rollout.engine != "vllm":
            raise ValueError(f"rollout.async_steps: {k} needs rollout.engine: vllm (servers that generate while the "
                             f"trainer updates); rollout.engine={self.rollout.engine!r} shares the trainer's weights, "
                             "use rollout.async_steps: 0")
        if self.rollout.vllm.sleep_during_update:
            raise ValueError(f"rollout.async_steps: {k} keeps the servers generating during the update; "
                             "rollout.vllm.sleep_during_update cannot be on with it")
        if self.loss.tis_cap is None:
            raise ValueError(f"rollout.async_steps: {k} trains on samples up to {k} update(s) old; set loss.tis_cap "
                             "(e.g. 2.0) for the capped importance weight that corrects for it")
        return self

    @model_validator(mode="after")
    def _partial_needs_one_async_server(self) -> "TrainConfig":
        r = self.rollout
        if not r.partial_rollout:
            return self
        if r.async_steps == 0 or r.engine != "vllm":
            raise ValueError(f"rollout.partial_rollout: true keeps samples in flight across the weight loads of "
                             f"rollout.async_steps >= 1 on a vLLM server; here rollout.async_steps={r.async_steps}, "
                             f"rollout.engine={r.engine!r}: use rollout.partial_rollout: false")
        return self


    @model_validator(mode="after")
    def _carry_over_streams_across_loads(self) -> "TrainConfig":
        s = self.sampler
        if not s.carry_over:
            return self
        if s.name != "ada" or s.schedule != "streaming" or not self.rollout.partial_rollout:
            raise ValueError(f"sampler.carry_over: true keeps Ada's streaming pools open across steps, their "
                             f"requests running through the weight loads of partial rollout; here sampler.name="
                             f"{s.name!r}, sampler.schedule={s.schedule!r}, rollout.partial_rollout="
                             f"{self.rollout.partial_rollout}: use sampler.carry_over: false")
        if s.global_sample_cap is not None:
            raise ValueError(f"sampler.global_sample_cap: {s.global_sample_cap} caps one step's samples, and under "
                             "sampler.carry_over a pool's samples span steps: use sampler.global_sample_cap: null")
        bound, k = self.rollout.max_staleness, self.rollout.async_steps
        if bound is not None and bound < k:
            raise ValueError(f"rollout.max_staleness: {bound} is below rollout.async_steps: {k}, which a batch drawn "
                             f"ahead already reaches: use rollout.max_staleness >= {k}")
        if bound == k and self.rollout.stale == "drop":
            raise ValueError(f"rollout.stale: 'drop' with rollout.max_staleness: {bound} = rollout.async_steps: every "
                             f"prompt must enter the batch of the step it joins, and a step's batch waits for all of "
                             f"its own prompts, so nothing is ever carried or dropped: use rollout.stale: wait, or "
                             f"rollout.max_staleness > {k}")
        return self


def validate_config(data: dict[str, Any], origin: Callable[[str], str | None] | None = None) -> TrainConfig:
    """`data` as a TrainConfig, or one `ConfigError` line naming each bad field. `origin(dotted)` says where
    a field's value came from when that is not the command line (`config file run.yaml, line 3`)."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, origin)) from None


def format_validation_error(err: ValidationError, origin: Callable[[str], str | None] | None = None) -> str:
    """One line: each error as `<field>: <why> (got <value>)`, `; `-separated. A check across fields (a model
    validator: its input is a whole section or the whole config) names its fields itself, so its input is
    not repeated; a long value is cut."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        value = e.get("input")
        cross_field = e["type"] == "value_error" and isinstance(value, dict)
        got = "" if cross_field else f" (got {_short(value)})"
        where = origin(loc) if origin is not None and loc else None
        text = f"{loc}: {msg}{got}" if loc and not msg.startswith(f"{loc}") else f"{msg}{got}"
        parts.append(f"{where}: {text}" if where else text)
    return "invalid config: " + "; ".join(parts)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten_dotted(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"sampler": {"M": 8}}` -> `{"sampler.M": 8}`; an empty section stays a value (`{}`)."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten_dotted(value, name))
        else:
            out[name] = value
    return out


def flat_params(config: TrainConfig) -> dict[str, Any]:
    """Dotted key -> value for every field, for logging as run parameters."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out[prefix] = value

    walk("", config.model_dump())
    return out
