"""Typed configs: the pydantic schema every entry point validates against.

One schema serves the CLI (`--set sampler.M=8`), YAML config files and Prefect's UI forms, so every
field carries a description: what it controls, its units, and where its default comes from
(`paper` = arXiv 2510.04996, `ref` = the public `run_reinforce_ada.sh`, `ours` = our choice).
The presets and profiles that fill it are in presets.py.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ada_core.config.applies import ALWAYS, LABEL, when
from ada_core.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SamplerConfig(_Strict):
    """How each step's groups are drawn."""

    name: Literal["fixed", "dynamic_filter", "ada", "budgeted", "est"] = Field(
        "fixed",
        description="Sampler: `fixed` = GRPO (n per prompt in one call), `dynamic_filter` = DAPO dynamic "
        "sampling, `ada` = Reinforce-Ada successive elimination, `budgeted` = a fixed per-step budget spent "
        "by `allocation` (ada_core/sampling/allocation.py), `est` = Reinforce-Ada-Est (paper v3): each "
        "prompt's pass rate estimated from its history, N_x proportional to 1/sqrt(p_hat) within [est_min, "
        "est_max], the step's budget in one call.",
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
        "paper's scale in our server model (docs/BENCHMARKS.md `## Streaming elimination`). Ours.",
        json_schema_extra=when("sampler.name == ada", "sampler.schedule == streaming"),
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
        description="budgeted, est: every prompt's prior is Beta(s/2, s/2) (1 = Jeffreys, 2 = flat) plus, for "
        "curated prompts, their measured pass rate as pseudo-counts.",
        json_schema_extra=when("sampler.name in [budgeted, est]"),
    )
    prior_weight: float = Field(
        1.0, ge=0.0,
        description="budgeted, est: a curated prompt's curation_k samples count as this many pseudo-observations "
        "each.",
        json_schema_extra=when("sampler.name in [budgeted, est]"),
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

    # est (Reinforce-Ada-Est, arXiv 2510.04996v3; ada_core/sampling/allocation.py, EstHistory).
    est_min: int = Field(
        2, ge=2,
        description="est: N_min, the fewest samples a prompt gets in a step (2: the least that can hold a "
        "positive and a negative). Ours.",
        json_schema_extra=when("sampler.name == est"),
    )
    est_max: int = Field(
        16, ge=2,
        description="est: N_max, the most samples a prompt gets in a step (16 = 4n at n = 4). Ours.",
        json_schema_extra=when("sampler.name == est"),
    )
    est_discount: float = Field(
        0.9, gt=0.0, le=1.0,
        description="est: at each visit a prompt's past positive and negative counts are multiplied by this "
        "before the new ones are added (the policy moves; old outcomes describe an older one). 1 = keep all. "
        "Ours.",
        json_schema_extra=when("sampler.name == est"),
    )
    est_weighting: Literal["log", "none"] = Field(
        "log",
        description="est: `log` = the gradient of the objective log p: each prompt's mean gradient weighted by "
        "1/p_hat (the pre-visit estimate), weights normalised to mean 1 over the step's sampled prompts; "
        "`none` = every sample weighted alike, as GRPO.",
        json_schema_extra=when("sampler.name == est"),
    )

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


# A server this run launches (not one it attaches to with base_url / base_urls).
_LAUNCHED = ("rollout.engine == vllm", "rollout.vllm.base_url == null", "rollout.vllm.base_urls == []")


class VLLMConfig(_Strict):
    """The vLLM server behind `rollout.engine: vllm` (see ada_core/engines/vllm_engine.py)."""

    base_url: str | None = Field(
        None, description="Attach to a running server (e.g. http://127.0.0.1:8000) instead of launching one. "
        "The run loads its weights into it first; one run per server at a time.",
        json_schema_extra=when("rollout.engine == vllm")
    )
    base_urls: list[str] = Field(
        default_factory=list, description="Attach to several running servers as one pool (requests spread by "
        "least outstanding work, weights synced to all, a dead one's requests retried on the others). "
        "Exclusive with base_url and num_servers > 1.", json_schema_extra=when("rollout.engine == vllm")
    )
    num_servers: int = Field(
        1, ge=1, description="vLLM servers to launch as one pool (each on 127.0.0.1 with its own KV cache). On a "
        "GPU machine each launched server sees every GPU; to pin one GPU per server, start them yourself with "
        "CUDA_VISIBLE_DEVICES and attach with base_urls (infra/GPU.md). Ours: 1.",
        json_schema_extra=when("rollout.engine == vllm")
    )
    port: int = Field(0, ge=0, le=65535, description="Port of a launched server on 127.0.0.1 (server i: port + i); "
                      "0 picks free ones.",
                      json_schema_extra=when(*_LAUNCHED))
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Server dtype; `auto` follows the trainer (float32, or bfloat16 with optim.precision=bf16).",
        json_schema_extra=when(*_LAUNCHED)
    )
    max_model_len: int | None = Field(
        None, ge=1, description="Context length of a launched server; None = the model's own.",
        json_schema_extra=when(*_LAUNCHED)
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="GPU only: the share of GPU memory vLLM may take. 0.5 leaves the rest "
        "to the trainer on one shared GPU; ~0.9 on a rollout-only GPU.",
        json_schema_extra=when(*_LAUNCHED, "run.device == cuda")
    )
    cpu_kvcache_gib: int = Field(1, ge=1, description="CPU only: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE).",
                                 json_schema_extra=when(*_LAUNCHED, "run.device == cpu"))
    enforce_eager: bool = Field(True, description="Skip CUDA-graph capture: faster start; set false on GPU for speed.",
                                json_schema_extra=when(*_LAUNCHED))
    concurrency: int = Field(64, ge=1, description="Completion requests in flight at once.",
                             json_schema_extra=when("rollout.engine == vllm"))
    startup_timeout_s: float = Field(300.0, gt=0.0, description="Seconds to wait for /health.",
                                     json_schema_extra=when(*_LAUNCHED))
    request_timeout_s: float = Field(600.0, gt=0.0, description="Seconds one HTTP request may take.",
                                     json_schema_extra=when("rollout.engine == vllm"))
    sleep_during_update: bool = Field(
        False, description="GPU only: /sleep (level 1) during the update and /wake_up after, for one GPU shared "
        "with the trainer. Refused on CPU: vLLM's sleep mode is CUDA-only.",
        json_schema_extra=when("rollout.engine == vllm")
    )
    sync_dir: str | None = Field(
        None, description="Where the trainer writes safetensors for the weight sync; None = /dev/shm (or the temp dir).",
        json_schema_extra=when("rollout.engine == vllm")
    )
    extra_args: list[str] = Field(default_factory=list, description="More `vllm serve` flags for a launched server.",
                                  json_schema_extra=when(*_LAUNCHED))

    @model_validator(mode="after")
    def _one_way_to_name_servers(self) -> "VLLMConfig":
        if self.base_urls and self.base_url is not None:
            raise ValueError("give base_url (one server) or base_urls (a pool), not both")
        if self.num_servers > 1 and (self.base_urls or self.base_url is not None):
            raise ValueError("num_servers > 1 launches servers; it cannot be combined with base_url or base_urls")
        return self


class RolloutConfig(_Strict):
    engine: Literal["transformers", "vllm"] = Field(
        "transformers", description="Rollout engine: `transformers` (embedded CPU default) or `vllm` (server).",
        json_schema_extra=ALWAYS
    )
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature. Ref: 1.0.", json_schema_extra=ALWAYS)
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling. Ref: 1.0.", json_schema_extra=ALWAYS)
    max_tokens: int = Field(2048, ge=1, description="Max response tokens. Ref: 2048.", json_schema_extra=ALWAYS)
    micro_batch_size: int = Field(64, ge=1, description="Sequences per generate() call on the engine. Ours.",
                                  json_schema_extra=when("rollout.engine == transformers or run.curate == true"))
    async_steps: int = Field(
        0, ge=0, description="0: the synchronous loop (rollout, then update, then weight sync). k >= 1: the "
        "servers draw the next steps' batches while the trainer updates, from a policy at most k updates old "
        "(docs/ALGORITHM.md, Asynchronous rollout); needs rollout.engine: vllm and loss.tis_cap. Ours: 0.",
        json_schema_extra=when("rollout.engine == vllm")
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)


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
        "as possible (fast collectives); STRICT_PACK requires one node.",
        json_schema_extra=when("distributed.num_ranks > 1")
    )
    startup_timeout_s: float = Field(
        300.0, gt=0.0, description="Seconds to wait for the placement group and for every rank to load the "
        "model and join the process group.", json_schema_extra=when("distributed.num_ranks > 1")
    )


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
    checkpoint_every: int = Field(50, ge=0, description="Checkpoint every C steps; 0 = only at the end.",
                                  json_schema_extra=ALWAYS)
    sft_steps: int = Field(0, ge=0, description="SFT warm-start steps before RL (tiny model). Ours.",
                           json_schema_extra=ALWAYS)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)

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


def validate_config(data: dict[str, Any]) -> TrainConfig:
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "config"
        lines.append(f"{loc}: {e['msg']} (got {e.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


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
