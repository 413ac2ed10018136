"""The rollout config sections: how samples are generated (`rollout`) and the vLLM server(s) behind
`rollout.engine: vllm` (`rollout.vllm`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ada_core.config.applies import ALWAYS, when
from ada_core.config.strict import _Strict


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
        None, description="Where the trainer writes safetensors for the weight sync; None = /dev/shm (or the temp dir). "
        "A killed run's folder there is removed by the next run's start on the same machine.",
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
    partial_rollout: bool = Field(
        False, description="Samples in flight survive a weight load: at each load the servers' in-flight samples "
        "are stopped, the new weights load, and each resumes from the tokens it has on the new weights, so one "
        "sample's tokens can come from two policy versions (Sample.token_versions; each token's behaviour "
        "log-prob is the one its version sampled it with, and the loss weights it per token). The next batch's "
        "draw no longer waits behind a load. Needs rollout.async_steps >= 1 on vLLM (one server or a pool) "
        "(docs/ALGORITHM.md, Partial rollout). verl / OpenRLHF / AReaL's partial rollout. Ours: off.",
        json_schema_extra=when("rollout.engine == vllm", "rollout.async_steps >= 1")
    )
    max_staleness: int | None = Field(
        None, ge=1,
        description="sampler.carry_over: the most updates any trained token may be behind the policy it is "
        "trained against. A prompt drawn for step d has no token older than d - 1 - rollout.async_steps, so it "
        "must enter a batch by step d + max_staleness - rollout.async_steps; `rollout.stale` says what happens "
        "to one that is not done by then. Null: no bound but the pool's maximum (N rounds). verl's "
        "max_off_policy_threshold, AReaL's max_head_offpolicyness.",
        json_schema_extra=when("sampler.carry_over == true"),
    )
    stale: Literal["wait", "drop"] = Field(
        "wait",
        description="sampler.carry_over with rollout.max_staleness: a prompt due by the bound is `wait`ed for "
        "(the step's batch takes it once done) or `drop`ped (its requests cancelled, its samples counted in "
        "budget/dropped_*). `drop` removes exactly the prompts Ada exists for, the slow hard ones still sampling "
        "for a positive or a negative, so the trained prompts lean easy: sampler/dropped_prompts and "
        "sampler/dropped_pass_rate show how many and how hard. Refused with max_staleness = async_steps, where "
        "nothing can be carried or dropped. verl's wait / drop.",
        json_schema_extra=when("sampler.carry_over == true", "rollout.max_staleness != null"),
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
