"""The algorithm's config sections: how each step's groups are drawn (`sampler`), their advantages
(`advantage`), the policy loss (`loss`) and the optimiser (`optim`). The presets set these
(ada_core/config/presets.py); TrainConfig (schema.py) holds them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ada_core.config.applies import ALWAYS, when
from ada_core.config.strict import _Strict


class SamplerConfig(_Strict):
    """How each step's groups are drawn."""

    name: str = Field(
        "fixed",
        description="Sampler: `fixed` = GRPO (n per prompt in one call), `dynamic_filter` = DAPO dynamic "
        "sampling, `ada` = Reinforce-Ada successive elimination, `budgeted` = a fixed per-step budget spent "
        "by `allocation` (ada_core/sampling/allocation.py), `est` = Reinforce-Ada-Est (paper v3): each "
        "prompt's pass rate estimated from its history, N_x proportional to 1/sqrt(p_hat) within [est_min, "
        "est_max], the step's budget in one call. The research samplers `knapsack`, `pilot`, `greso` and "
        "`ada_v3w` (ada_core/sampling/research.py; docs/ALGORITHM.md, Research samplers). Or any sampler registered "
        "with `register_sampler` (docs/SAMPLERS.md).",
        json_schema_extra=ALWAYS,
    )
    options: dict[str, Any] = Field(
        {},
        validate_default=True,  # a plugin's defaults are filled in (and logged) when no option is given
        description="The options of a registered sampler of your own (`register_sampler(name, options=...)`; "
        "docs/SAMPLERS.md), validated by its options model, defaults filled in; logged as `sampler.options.<field>`. "
        "The platform's five samplers take none: their fields are the ones here. The research samplers' options: "
        "docs/ALGORITHM.md, Research samplers.",
        json_schema_extra=ALWAYS,
    )
    n: int = Field(4, ge=2, description="Final group size per prompt (samples trained on). Paper/ref: 4.",
                   json_schema_extra=ALWAYS)
    exit_rule: Literal["pos", "balance", "mixed"] = Field(
        "balance",
        description="ada: when a prompt stops sampling. `pos` = at least 1 positive; `balance` = at least "
        "n//2 positives and n - n//2 negatives; `mixed` = at least 1 of each (ours). Ref default: balance. "
        "`budgeted` always uses `mixed`.",
        json_schema_extra=when("sampler.name == ada"),
    )
    M: int = Field(8, ge=1, description="ada: samples per active prompt per round. Ref: 8.",
                   json_schema_extra=when("sampler.name in [ada, budgeted]"))
    N: int = Field(4, ge=1, description="ada: maximum number of rounds. Ref: 4.",
                   json_schema_extra=when("sampler.name in [ada, budgeted]"))
    M0: int | None = Field(
        None, ge=1, description="ada: first-round size; None means M. Ours (not in the paper).",
        json_schema_extra=when("sampler.name == ada")
    )
    global_sample_cap: int | None = Field(
        None,
        ge=1,
        description="ada: cap on samples generated per step over all prompts; a round that would pass it "
        "is shrunk to fit. None = no cap. Ours.",
        json_schema_extra=when("sampler.name == ada"),
    )
    unresolved: Literal["keep", "drop"] = Field(
        "keep",
        description="ada: prompts still active after N rounds are kept (ref code; uniform groups get zero "
        "advantage) or dropped (paper's passive filtering). budgeted, est: uniform pools, the same choice.",
        json_schema_extra=when("sampler.name in [ada, budgeted, est]"),
    )
    downsample: Literal["balanced", "random"] = Field(
        "balanced",
        description="ada: how a pool is cut to n. `balanced` targets n//2 positives and fills any shortfall "
        "from the other class; `random` draws uniformly. Always a seeded random draw (ref takes first-k).",
        json_schema_extra=when("sampler.name in [ada, budgeted]"),
    )
    positive_threshold: float = Field(
        0.7, ge=0.0, le=1.0, description="A sample is positive when reward > this. Ref: 0.7.", json_schema_extra=ALWAYS
    )
    gen_batch_multiplier: float = Field(
        1.0,
        gt=0.0,
        description="dapo: each generation batch draws this many times the step's prompts. Ours: 1.0.",
        json_schema_extra=when("sampler.name == dynamic_filter"),
    )
    max_gen_batches: int = Field(
        3, ge=1, description="dapo: generation batches before falling back to the groups kept so far. Ours.",
        json_schema_extra=when("sampler.name == dynamic_filter")
    )
    std_eps: float = Field(
        1e-6, gt=0.0, description="dapo: a group counts as varied when its reward std exceeds this.",
        json_schema_extra=when("sampler.name == dynamic_filter")
    )
    schedule: Literal["rounds", "streaming"] = Field(
        "rounds",
        description="ada: `rounds` = one batched engine call per round, exits checked at the round's end "
        "(paper/ref); `streaming` = one request per sample, committed to its prompt's pool in index order "
        "with the exit checked after every sample and the prompt's outstanding samples aborted once it exits "
        "(ada_core/sampling/streaming.py; needs rollout.engine: vllm). Same pools' rule, no round barrier. Ours.",
        json_schema_extra=when("sampler.name == ada"),
    )
    window: int = Field(
        8,
        ge=1,
        description="ada, schedule=streaming: samples of one prompt in flight on the server at once. Too small "
        "starves the server, too large wastes tokens on aborted samples; 8 minimised generation time at the "
        "paper's scale in our server model (docs/benchmarks/streaming.md). Ours.",
        json_schema_extra=when("sampler.name == ada", "sampler.schedule == streaming"),
    )
    carry_over: bool = Field(
        False,
        description="ada, schedule=streaming, with rollout.partial_rollout: a step's batch takes the first B "
        "prompts done (exited, or at their maximum pool, counted across steps) in prompt order; the prompts "
        "still sampling keep their pools and their requests run on across the weight load, entering a later "
        "batch once done, and the next step's prompts start in the slots this step's tail leaves free "
        "(ada_core/sampling/stream_session.py; docs/ALGORITHM.md, Carry-over). Ours: off.",
        json_schema_extra=when("sampler.name == ada", "sampler.schedule == streaming", "rollout.partial_rollout == true"),
    )
    # budgeted (ada_core/sampling/allocation.py); ours, after Knapsack RL, VIP, GRESO and MoPPS.
    allocation: Literal["posterior", "elimination"] = Field(
        "posterior",
        description="budgeted: `posterior` = greedy by marginal gain in expected mixed pools, one engine call; "
        "`elimination` = Ada's rounds under the budget, exited prompts' leftover moved to the active ones.",
        json_schema_extra=when("sampler.name == budgeted"),
    )
    budget: int | None = Field(
        None, ge=1,
        description="budgeted, est: samples generated per step (budgeted: never exceeded; est: spent exactly). "
        "None = prompts_per_step x n, GRPO's samples per step, so per-step curves are equal-generation curves.",
        json_schema_extra=when("sampler.name in [budgeted, est]"),
    )
    prior_strength: float = Field(
        1.0, gt=0.0,
        description="budgeted: every prompt's prior is Beta(s/2, s/2) (1 = Jeffreys, 2 = flat) plus, for "
        "curated prompts, their measured pass rate as pseudo-counts.",
        json_schema_extra=when("sampler.name == budgeted"),
    )
    prior_weight: float = Field(
        1.0, ge=0.0,
        description="budgeted: a curated prompt's curation_k samples count as this many pseudo-observations "
        "each.",
        json_schema_extra=when("sampler.name == budgeted"),
    )
    forget: float = Field(
        0.99, gt=0.0, le=1.0,
        description="budgeted: a prompt's training evidence is multiplied by this per step since it was seen "
        "(the policy moves). 1 = never forget.",
        json_schema_extra=when("sampler.name == budgeted"),
    )
    skip_confidence: float = Field(
        0.8, gt=0.0, le=1.0,
        description="budgeted: skip a prompt before rollout when its posterior gives its n-group this "
        "probability (or more) of being uniform. 1 = skip only what the budget cannot reach.",
        json_schema_extra=when("sampler.name == budgeted"),
    )
    explore_after: int = Field(
        2, ge=0,
        description="budgeted: the exploration floor. A prompt skipped this many draws in a row gets n samples on "
        "its next draw, so it is retested within explore_after + 1 draws. 0 = never skip.",
        json_schema_extra=when("sampler.name == budgeted"),
    )

    # est (Reinforce-Ada-Est, arXiv 2510.04996v3 sections 3-4 and Algorithm 1; ada_core/sampling/allocation.py,
    # EstHistory; docs/ALGORITHM.md marks which choices are the paper's and which are ours).
    est_min: int = Field(
        2, ge=1,
        description="est: N_min, the fewest samples a prompt gets in a step (2: the least that can hold a "
        "positive and a negative). Ours.",
        json_schema_extra=when("sampler.name == est"),
    )
    est_max: int = Field(
        32, ge=1,
        description="est: N_max, the most samples a prompt gets in a step (32 = 4n at the preset's n = 8). Ours.",
        json_schema_extra=when("sampler.name == est"),
    )
    est_ema: float = Field(
        0.9, ge=0.0, lt=1.0,
        description="est: the EMA factor of each prompt's pass-rate estimate: at each visit p_hat <- ema p_hat + "
        "(1 - ema) (this visit's pass rate). 0 = the last visit alone. 0.9 as the authors' code.",
        json_schema_extra=when("sampler.name == est"),
    )
    est_prior: list[float] = Field(
        [1.0, 16.0], min_length=2, max_length=2,
        description="est: Beta(a, b) whose mean a / (a + b) starts the estimate of a prompt with no curation "
        "measurement (a curated prompt starts from its measured pass rate). [1, 16] as the authors' code.",
        json_schema_extra=when("sampler.name == est"),
    )
    est_weighting: Literal["log", "none"] = Field(
        "log",
        description="est: `log` = v3's Algorithm 1: each prompt's advantages times 1 / sqrt(r_bar + est_eps), "
        "r_bar the pass rate of this step's samples of the prompt, unnormalised (with N_x ~ 1/sqrt(p_hat) a "
        "prompt's total weight is then ~ 1/p, the log objective's gradient); `none` = every sample alike.",
        json_schema_extra=when("sampler.name == est"),
    )
    est_eps: float = Field(
        1e-6, gt=0.0,
        description="est: the eps of the weight 1 / sqrt(r_bar + eps) (its value is not given in the paper; "
        "an all-wrong pool has zero advantage, so it only keeps the weight finite). Ours.",
        json_schema_extra=when("sampler.name == est", "sampler.est_weighting == log"),
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        from ada_core.config.registry import get_sampler

        get_sampler(name)  # unknown: ConfigError naming sampler.name and the registered samplers
        return name

    @field_validator("options")
    @classmethod
    def _options_of_the_sampler(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        from ada_core.config.registry import check_options

        name = info.data.get("name")
        return options if name is None else check_options(name, options)  # no name: its own error is reported

    @property
    def first_round(self) -> int:
        return self.M0 if self.M0 is not None else self.M

    @property
    def max_samples_per_prompt(self) -> int:
        """The most samples one prompt can draw in a step."""
        if self.name == "budgeted":
            return self.n + (self.N - 1) * self.M
        if self.name == "est":
            return self.est_max
        if self.name != "ada":
            return self.n
        return self.first_round + (self.N - 1) * self.M

    @model_validator(mode="after")
    def _streaming_is_ada(self) -> "SamplerConfig":
        if self.schedule == "streaming" and self.name != "ada":
            raise ValueError(f"sampler.schedule: 'streaming' is an ada schedule; sampler.name={self.name!r} draws "
                             "in one call per batch (use schedule: rounds)")
        return self

    @model_validator(mode="after")
    def _enough_samples(self) -> "SamplerConfig":
        if self.name == "ada" and self.max_samples_per_prompt < self.n:
            raise ValueError(
                f"sampler.M0 + (sampler.N - 1) * sampler.M = {self.max_samples_per_prompt} must be >= "
                f"sampler.n = {self.n}: a prompt could never fill its group"
            )
        if self.name == "ada" and self.global_sample_cap is not None and self.global_sample_cap < self.n:
            raise ValueError(f"sampler.global_sample_cap = {self.global_sample_cap} is below sampler.n = {self.n}: no "
                             "pool could reach n samples, so every step would train on no group")
        if self.name == "budgeted" and self.budget is not None and self.budget < self.n:
            raise ValueError(f"sampler.budget = {self.budget} is below sampler.n = {self.n}: no group could be filled")
        if self.name == "est" and self.est_min > self.est_max:
            raise ValueError(f"sampler.est_min = {self.est_min} is above sampler.est_max = {self.est_max}")
        if self.name == "est" and not (self.est_prior[0] > 0 and self.est_prior[1] > 0):
            raise ValueError(f"sampler.est_prior: both Beta parameters must be > 0, got {self.est_prior}")
        return self


class AdvantageConfig(_Strict):
    name: Literal["grpo", "group_mean", "global_mean", "global_mean_std", "rloo"] = Field(
        "grpo",
        description="Advantage estimator (registry in ada_core.rl.advantages). Ada ref: global_mean (pool mean "
        "baseline, no std); GRPO: grpo (group mean/std).",
        json_schema_extra=ALWAYS,
    )
    eps: float = Field(1e-6, gt=0.0, description="Added to the std; also the zero-variance tolerance.",
                       json_schema_extra=when("advantage.name in [grpo, global_mean_std]"))


class LossConfig(_Strict):
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="PPO ratio clip below 1. Ref: 0.2.",
                            json_schema_extra=ALWAYS)
    clip_high: float = Field(0.28, ge=0.0, description="PPO ratio clip above 1. Ref: 0.28 (clip-higher).",
                             json_schema_extra=ALWAYS)
    dual_clip_c: float | None = Field(
        10.0, gt=1.0, description="Dual-clip bound for negative advantages; None disables. Ref: 10.",
        json_schema_extra=ALWAYS
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus. Paper: 1e-4; ref script: 0.",
                                json_schema_extra=ALWAYS)
    kl_coef: float = Field(0.0, ge=0.0, description="KL to a frozen reference model; 0 = off (ref).",
                           json_schema_extra=ALWAYS)
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="How per-token losses reduce to a scalar. Ref: token-mean.", json_schema_extra=ALWAYS
    )
    exclude_zero_adv: bool = Field(
        False,
        description="Leave tokens of zero-advantage groups out of the token-mean denominator. Ours: off.",
        json_schema_extra=ALWAYS,
    )
    mask_truncated: bool = Field(
        False, description="Give truncated responses no loss (DAPO overlong filtering). Ours: off.",
        json_schema_extra=ALWAYS
    )
    tis_cap: float | None = Field(
        None,
        ge=1.0,
        description="Truncated importance sampling: multiply each token's PPO-clip loss by the detached weight "
        "min(exp(old - behaviour), tis_cap), correcting for a rollout engine whose log-probs differ from the "
        "trainer's (e.g. vLLM in bf16). None = off. >= 1 so on-policy tokens (weight 1) keep their full "
        "weight. verl's tis_imp_ratio_cap; 2 is the usual value. Ours: off.",
        json_schema_extra=ALWAYS,
    )


class OptimConfig(_Strict):
    lr: float = Field(1e-6, gt=0.0, description="AdamW learning rate. Ref: 1e-6 (7B model).", json_schema_extra=ALWAYS)
    warmup_steps: int = Field(10, ge=0, description="Linear lr warm-up, in optimizer steps. Ref: 10.",
                              json_schema_extra=ALWAYS)
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay. Ref Ada: 0.", json_schema_extra=ALWAYS)
    grad_clip: float = Field(1.0, gt=0.0, description="Global grad-norm clip. Ref: 1.0.", json_schema_extra=ALWAYS)
    mini_batches: int = Field(
        4, ge=1, description="Optimizer steps per training step (prompts split evenly). Ref: 512/128 = 4.",
        json_schema_extra=ALWAYS
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over the step's groups. Ref: 1.", json_schema_extra=ALWAYS)
    micro_batch_size: int = Field(
        16, ge=1, description="Sequences per forward/backward; gradients accumulate. Ours.", json_schema_extra=ALWAYS
    )
    share_prompts: bool = Field(
        True,
        description="Read each distinct prompt of a micro-batch once in the update's forward, its copies (a "
        "group's samples) taking that row's cache, and a sequence the micro-batch repeats (samples with the same "
        "answer) once: the same loss, 1.6-1.8x faster on the testbed. The log-probs agree with one read per row to "
        "~1e-5, not bit for bit, as another CPU's kernels do (on the testbed 33 of a grid's 35 runs came out value "
        "for value those made without it). Ours: on.",
        json_schema_extra=ALWAYS,
    )
    zero_stage: Literal[0, 1, 2] = Field(
        0, description="DeepSpeed ZeRO stage: 0, 1 or 2. Not 3: it partitions the parameters, and the in-process "
        "rollout engine, the weight sync and save_pretrained need whole ones. Ours: 0 on one CPU process.",
        json_schema_extra=ALWAYS)
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Training precision. `bf16` turns on DeepSpeed's bf16 mode: the model, shared with the "
        "in-process rollout engine, runs in bfloat16 and the optimizer keeps fp32 master weights. Meant for "
        "GPUs (infra/gpu/zero2_bf16.yaml); it runs on CPU too, but ~3x slower than fp32 on CPUs without bf16 "
        "matrix units. Ours: fp32.",
        json_schema_extra=ALWAYS,
    )
