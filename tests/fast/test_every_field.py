"""Every leaf config field does what it says, or is a label: the walk over the whole schema.

Each field declares where it applies (`json_schema_extra` in ada_core/config/schema.py, read by
ada_core/config/applies.py). This file holds each field to it:

- EFFECTS: `field -> (probe, base, value)`. A probe is a platform function that a run calls with the config
  (the sampler on the Bernoulli engine, the loss, the optimizer set-up, the run loop on a simulated engine,
  the vLLM server's command line, ...); the test asserts it gives something else when only `field` changes
  from its value under `base` to `value`. `base` (preset plus overrides) is a config where the field applies.
- ELSEWHERE: `field -> test id` for the few whose effect needs a model, a vLLM server or Ray: the test (of a
  slower tier) that asserts it.
- LABELS: fields no run reads; they name the run.

A field that is in none of them, or that declares nothing, fails `test_every_field_is_declared_and_covered`
with what to add. The whole walk takes a few seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ada_core.config import TrainConfig, build_config
from ada_core.config.applies import RUN_FACTS, applicability, leaf_fields
from ada_core.protocols import RolloutEngine, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
ADA = {"preset": "ada-balance"}
EST = {"preset": "ada-posterior"}  # the budgeted sampler's fields
PAPER_EST = {"preset": "ada-est"}  # the paper's Est (sampler.name: est)
DAPO = {"preset": "dapo"}
VLLM = {"rollout.engine": "vllm"}
RANKS = {"distributed.num_ranks": 2}

LABELS = {
    "preset": "the name of the preset the config was built from; its values are in the other fields",
    "profile": "the name of the scale profile the config was built from; its values are in the other fields",
}

# The testbed profile's curation inputs (the recipe of its shipped start, ada_core/data/shipped/testbed/), dotted.
TESTBED_RECIPE = {"model": "tiny-l4", "sft_steps": 2000, "sft.lr": 1e-3, "sft.prompts": 256000, "sft.carry_slip": 0.75,
                  "rollout.max_tokens": 8, "data.dataset": "arithmetic", "data.train_size": 18720,
                  "data.eval_size": 1024, "data.val_size": 256, "data.seed": 0, "data.curation_k": 16,
                  "data.keep_pass_rate": [0.0625, 0.3125]}

EFFECTS: dict[str, tuple[str, dict[str, Any], Any]] = {
    # the run loop on a simulated engine: what it samples, evaluates and checkpoints, and when
    "seed": ("run", {}, 1),
    "steps": ("run", {}, 2),
    "prompts_per_step": ("run", {}, 2),
    "eval_every": ("run", {}, 1),
    "eval_k": ("run", {}, 3),
    "eval_temperature": ("run", {}, 0.5),
    "eval_max_tokens": ("run", {}, 6),
    "checkpoint_every": ("run", {}, 1),
    "rollout.temperature": ("run", {}, 0.5),
    "rollout.top_p": ("run", {}, 0.9),
    "rollout.max_tokens": ("run", {}, 6),
    "checkpoint.keep_last": ("prune", {}, 1),
    # the samplers on the Bernoulli engine: groups, advantages, pools and metrics over three steps
    "sampler.name": ("sampler", {}, "ada"),
    "sampler.n": ("sampler", {}, 2),
    "sampler.positive_threshold": ("sampler", {}, 1.0),
    "sampler.exit_rule": ("sampler", ADA, "pos"),
    "sampler.M": ("sampler", ADA, 2),
    "sampler.N": ("sampler", ADA, 1),
    "sampler.M0": ("sampler", ADA, 2),
    "sampler.global_sample_cap": ("sampler", ADA, 20),
    "sampler.unresolved": ("sampler", ADA, "drop"),
    "sampler.downsample": ("sampler", ADA, "random"),
    "sampler.schedule": ("sampler", {**ADA, **VLLM}, "streaming"),
    "sampler.window": ("streaming", {**ADA, **VLLM, "sampler.schedule": "streaming"}, 2),
    "sampler.gen_batch_multiplier": ("sampler", DAPO, 2.0),
    "sampler.max_gen_batches": ("sampler", DAPO, 1),
    "sampler.std_eps": ("sampler", DAPO, 0.6),
    "sampler.allocation": ("sampler", EST, "elimination"),
    "sampler.budget": ("sampler", EST, 12),
    "sampler.prior_strength": ("sampler", EST, 20.0),
    "sampler.prior_weight": ("sampler", EST, 0.0),
    "sampler.forget": ("sampler", EST, 0.1),
    "sampler.skip_confidence": ("sampler", EST, 0.3),
    "sampler.explore_after": ("sampler", EST, 0),
    "sampler.est_min": ("sampler", PAPER_EST, 3),
    "sampler.est_max": ("sampler", PAPER_EST, 9),
    "sampler.est_ema": ("est_history", PAPER_EST, 0.1),
    "sampler.est_prior": ("est_prior", PAPER_EST, [4.0, 4.0]),
    "sampler.est_weighting": ("sampler", PAPER_EST, "none"),
    "sampler.est_eps": ("sampler", PAPER_EST, 0.5),
    "advantage.name": ("sampler", {}, "rloo"),
    "advantage.eps": ("sampler", {}, 0.5),
    # the loss on fixed tensors
    "loss.clip_low": ("loss", {}, 0.05),
    "loss.clip_high": ("loss", {}, 0.05),
    "loss.dual_clip_c": ("loss", {}, 1.5),
    "loss.entropy_coef": ("loss", {}, 0.1),
    "loss.kl_coef": ("loss", {}, 0.1),
    "loss.aggregation": ("loss", {}, "seq-mean-token-mean"),
    "loss.exclude_zero_adv": ("loss", {}, True),
    "loss.mask_truncated": ("loss", {}, True),
    "loss.tis_cap": ("loss", {}, 2.0),
    # the optimizer, its schedule, DeepSpeed's config and the update's plan
    "optim.lr": ("optim", {}, 1e-3),
    "optim.warmup_steps": ("optim", {}, 0),
    "optim.weight_decay": ("optim", {}, 0.1),
    "optim.grad_clip": ("optim", {}, 0.5),
    "optim.mini_batches": ("optim", {}, 2),
    "optim.ppo_epochs": ("optim", {}, 2),
    "optim.micro_batch_size": ("optim", {}, 1),
    "optim.zero_stage": ("optim", {}, 2),
    "optim.precision": ("optim", {}, "bf16"),
    # data: the run's split, the prompt-length limit, curation
    "data.dataset": ("data", {}, "arithmetic:2"),
    "data.train_size": ("data", {}, 40),
    "data.eval_size": ("data", {}, 4),
    "data.train_pool": ("data", {}, 5),
    "data.seed": ("data", {}, 3),
    "data.val_size": ("data", {}, 16),
    "sft.prompts": ("sft_draw", {"sft_steps": 1}, 300),
    "sft.carry_slip": ("sft_draw", {"sft_steps": 1}, 0.5),
    "sft.shipped": ("start", TESTBED_RECIPE, False),
    "data.max_prompt_tokens": ("encode", {}, 6),
    "data.curation_k": ("curation", {}, 2),
    "data.pass_rate_ceiling": ("curation", {}, 0.2),
    "data.keep_pass_rate": ("curation", {}, [0.25, 0.5]),
    "rollout.micro_batch_size": ("curation", {}, 3),
    # a launched vLLM server's command line and environment; the engine's client
    "rollout.vllm.port": ("vllm_server", VLLM, 8123),
    "rollout.vllm.dtype": ("vllm_server", VLLM, "bfloat16"),
    "rollout.vllm.max_model_len": ("vllm_server", VLLM, 64),
    "rollout.vllm.gpu_memory_utilization": ("vllm_server_on_gpu", VLLM, 0.9),
    "rollout.vllm.cpu_kvcache_gib": ("vllm_server", VLLM, 2),
    "rollout.vllm.enforce_eager": ("vllm_server", VLLM, False),
    "rollout.vllm.startup_timeout_s": ("vllm_server", VLLM, 30.0),
    "rollout.vllm.extra_args": ("vllm_server", VLLM, ["--seed", "1"]),
    "rollout.vllm.sleep_during_update": ("vllm_server", VLLM, True),
    "rollout.vllm.concurrency": ("vllm_engine", VLLM, 3),
    "rollout.vllm.request_timeout_s": ("vllm_engine", VLLM, 5.0),
    "rollout.vllm.sync_dir": ("vllm_engine", VLLM, "<tmp>"),
    # a step's answer checking
    "verifier.step_budget_s": ("verifier", {}, 0.5),
    # the prompt ledger; the rank placement
    "ledger.enabled": ("ledger", {}, False),
    "ledger.url": ("ledger", {}, "sqlite:///<tmp>/other.db"),
    "distributed.num_ranks": ("placement", {}, 3),
    "distributed.cpus_per_rank": ("placement", RANKS, 2.0),
    "distributed.gpus_per_rank": ("placement", RANKS, 1.0),
    "distributed.placement_strategy": ("placement", RANKS, "SPREAD"),
}

ELSEWHERE = {
    "eval_suite": "tests/flows/test_hub_flows.py::test_a_train_flow_named_by_hub_ids_trains_and_logs_their_commits",
    "eval_suite_revisions": "tests/flows/test_hub_flows.py::test_a_killed_hub_train_flow_resumes_at_the_commits_it_pinned",
    "model": "tests/flows/test_hub_flows.py::test_a_train_flow_named_by_hub_ids_trains_and_logs_their_commits",
    "optim.share_prompts": "tests/model/test_engines.py::test_a_prompt_and_a_repeated_sequence_read_once_give_the_update_of_one_read_per_row",
    "sft_steps": "tests/model/test_models.py::test_sft_learns_and_is_cached",
    "sft.lr": "tests/model/test_models.py::test_the_sft_section_reaches_the_warm_start",
    "sft.batch_size": "tests/model/test_models.py::test_the_sft_section_reaches_the_warm_start",
    # read by a sampler registered from outside the platform: the test registers one
    "sampler.options": "tests/fast/test_sampler_registry.py::test_an_option_changes_what_the_sampler_draws",
    "rollout.engine": "tests/services/test_vllm.py::test_a_few_steps_train_with_the_vllm_engine",
    "rollout.vllm.base_url": "tests/services/test_vllm.py::test_a_few_steps_train_with_the_vllm_engine",
    "rollout.vllm.base_urls": "tests/services/test_vllm_pool.py::test_an_async_streaming_run_goes_on_when_a_server_dies_mid_stream",
    "rollout.async_steps": "tests/services/test_async_rollout.py::test_async_steps_1_trains_with_each_sampler",
    "rollout.partial_rollout": "tests/services/test_partial_rollout.py::test_a_sample_in_flight_at_a_weight_load_spans_two_versions_each_with_its_own_logprobs",
    "sampler.carry_over": "tests/services/test_carry_over.py::test_a_carrying_run_trains_b_prompts_a_step_each_once_and_counts_each_sample_once",
    "rollout.max_staleness": "tests/services/test_carry_over.py::test_a_staleness_bound_of_async_steps_carries_nothing_and_every_token_is_at_most_one_update_old",
    "rollout.stale": "tests/services/test_carry_over.py::test_a_staleness_bound_of_async_steps_carries_nothing_and_every_token_is_at_most_one_update_old",
    "rollout.vllm.num_servers": "tests/services/test_vllm_pool.py::test_two_servers_share_a_round_and_both_take_the_new_weights",
    "distributed.ray_address": "tests/services/test_driver_death.py::test_a_ray_address_where_no_cluster_answers_is_one_line_and_exit_2",
    "distributed.startup_timeout_s": "tests/services/test_distributed.py::test_ranks_that_cannot_be_placed_are_a_clear_error",
}

WHAT_TO_ADD = (
    "every config field declares where it applies and is held to it: add json_schema_extra=ALWAYS, LABEL or "
    "when('<dotted path> <op> <value>', ...) next to its description in ada_core/config/schema.py "
    "(ada_core/config/applies.py explains the clauses), then add it to EFFECTS in tests/fast/test_every_field.py "
    "(a probe, a base config where it applies, a value that changes what the probe returns; add a probe if none "
    "reads it), to ELSEWHERE (the test id that asserts its effect, when that needs a model, a server or Ray), or "
    "to LABELS when no run reads it"
)


def nested(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def configs(name: str, tmp_path: Path) -> tuple[TrainConfig, TrainConfig]:
    """(base, changed): `name`'s base config, and the same with only `name` set to its EFFECTS value."""
    _, base, value = EFFECTS[name]
    base = dict(base)
    preset = base.pop("preset", "grpo")
    if isinstance(value, str):
        value = value.replace("<tmp>", str(tmp_path))
    facts = facts_for(name)
    return (build_config(preset, "tiny", overrides=nested(base), facts=facts),
            build_config(preset, "tiny", overrides=nested({**base, name: value}), facts=facts))


def facts_for(name: str) -> dict[str, Any]:
    """The run facts of `name`'s probe runs: they curate (the curation probe does), on the probe's device."""
    probe = EFFECTS[name][0]
    return {"run.curate": True, "run.device": "cuda" if probe.endswith("_on_gpu") else "cpu"}


# --- the probes -------------------------------------------------------------------------------------
def _prompts(num: int, seed: int = 0, curation_k: int = 4):
    from ada_core.sampling.simulate import make_prompts

    return make_prompts(num, np.random.default_rng(seed), curation_k=curation_k)


def _batch_signature(batch) -> tuple:
    groups = [(g.prompt.id, tuple(round(a, 9) for a in g.advantages), g.pool_size, g.pool_positives,
               tuple(tuple(s.completion_ids) for s in g.samples)) for g in batch.groups]
    metrics = {k: round(v, 9) for k, v in batch.metrics.items() if "time" not in k and not k.endswith("_s") and not math.isnan(v)}
    return tuple(groups), tuple(sorted(metrics.items())), tuple(p.exit_reason for p in batch.pools)


def probe_sampler(cfg: TrainConfig, tmp_path: Path):
    from ada_core.data.source import PromptSource
    from ada_core.sampling import make_sampler
    from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier

    source = PromptSource(_prompts(24), seed=0)
    sampler = make_sampler(cfg.sampler, cfg.advantage)
    out = []
    for step in range(1, 6):  # 24 prompts, 8 a step: steps 4 and 5 see prompts again (the budgeted history)
        try:
            batch = sampler.sample(source.take(8), BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14),
                                   np.random.default_rng(step), source=source)
        except ValueError as err:  # e.g. streaming asks the engine for per-sample requests
            return ("refused", str(err))
        out.append(_batch_signature(batch))
    return out


def probe_est_history(cfg: TrainConfig, tmp_path: Path):
    """The est sampler on 6 prompts visited 4 times each: the EMA moves the estimates from the second visit on."""
    from ada_core.sampling import make_sampler
    from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier

    prompts = _prompts(6)
    sampler = make_sampler(cfg.sampler, cfg.advantage)
    sampling = SamplingParams(max_tokens=14)
    return [_batch_signature(sampler.sample(prompts, BernoulliEngine(), BernoulliVerifier(), sampling,
                                            np.random.default_rng(step))) for step in range(1, 5)]


def probe_est_prior(cfg: TrainConfig, tmp_path: Path):
    """The est sampler on 6 prompts with no curation measurement, visited twice: the prior starts their estimates."""
    from ada_core.sampling import make_sampler
    from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier

    prompts = _prompts(6, curation_k=0)
    prompts[0].meta["curation_k"], prompts[0].difficulty = 4, 0.5  # one curated prompt: the others' share moves
    sampler = make_sampler(cfg.sampler, cfg.advantage)
    sampling = SamplingParams(max_tokens=14)
    return [_batch_signature(sampler.sample(prompts, BernoulliEngine(), BernoulliVerifier(), sampling,
                                            np.random.default_rng(step))) for step in range(1, 3)]


def probe_streaming(cfg: TrainConfig, tmp_path: Path):
    from ada_core.sampling.streaming import StreamSchedule

    schedule = StreamSchedule(6, cfg.sampler, cfg.sampler.window, capacity=cfg.rollout.vllm.concurrency)
    return schedule.starts()


def probe_loss(cfg: TrainConfig, tmp_path: Path):
    from ada_core.rl.losses import effective_mask, ppo_clip_loss

    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(4, 5, generator=g) * 0.3 - 1.0
    old = logprobs + torch.randn(4, 5, generator=g) * 0.8
    advantages = torch.tensor([1.0, -1.0, 0.0, 0.5])
    mask = torch.ones(4, 5)
    mask[3, 3:] = 0
    mask = effective_mask(mask, advantages, torch.tensor([False, True, False, False]), cfg.loss)
    loss, diagnostics = ppo_clip_loss(logprobs, old, advantages, mask, cfg.loss, entropy=torch.rand(4, 5, generator=g),
                                      ref_logprobs=old - 0.3, behaviour_logprobs=old - 1.0)
    return round(loss.item(), 9), tuple(sorted((k, round(v, 9)) for k, v in diagnostics.items()))


def probe_optim(cfg: TrainConfig, tmp_path: Path):
    from ada_core.engines.deepspeed_engine import optimizer_and_config
    from ada_core.engines.update_plan import plan_update

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    optimizer, schedule, ds_config = optimizer_and_config(model, cfg.optim)
    groups = [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups]
    scheduler, lrs = schedule(optimizer), []
    for _ in range(4):
        lrs.append(round(optimizer.param_groups[0]["lr"], 12))
        optimizer.step()
        scheduler.step()
    seqs = [{"group": i // 2, "advantage": 1.0, "truncated": False, "prompt": [1, 2], "completion": [1] * (1 + i)}
            for i in range(8)]
    plan = plan_update(seqs, 4, torch.Generator().manual_seed(0), cfg.optim, cfg.loss, world_size=1)
    return groups, lrs, json.dumps(ds_config, sort_keys=True), [(p.shares, p.denominators) for p in plan]


@dataclass
class _Recorded(RolloutEngine):
    """The Bernoulli engine, recording what each generate() call asked for."""

    calls: list = field(default_factory=list)

    def __post_init__(self) -> None:
        from ada_core.sampling.simulate import BernoulliEngine

        self.engine = BernoulliEngine()

    def generate(self, requests, sampling):
        self.calls.append((len(requests), sum(k for _, k in requests), sampling.temperature, sampling.top_p,
                           sampling.max_tokens))
        return self.engine.generate(requests, sampling)


def probe_run(cfg: TrainConfig, tmp_path: Path):
    """`run_steps` with the real rollout and evaluate steps on the Bernoulli engine; the update and the
    checkpoint record only when they ran (they need a model)."""
    from ada_core.data.source import PromptSource
    from ada_core.run.files import read_metrics
    from ada_core.sampling import make_sampler
    from ada_core.sampling.simulate import BernoulliVerifier
    from ada_core.training.loop import RunState, StepFunctions, evaluate, rollout_step, run_steps

    cfg = cfg.model_copy(update={"steps": min(cfg.steps, 3)})
    out = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    engine, checkpoints = _Recorded(), []
    prompts = _prompts(40)
    state = RunState(config=cfg, output_dir=out, tokenizer=None, rollout=engine, updater=None,
                     verifier=BernoulliVerifier(), source=PromptSource(prompts[:32], seed=cfg.seed),
                     eval_prompts=prompts[32:], rng=np.random.default_rng(cfg.seed),
                     sampler=make_sampler(cfg.sampler, cfg.advantage))
    steps = StepFunctions(rollout=rollout_step, update=lambda state, batch: {}, evaluate=evaluate,
                          checkpoint=lambda state: checkpoints.append(state.step) or out)
    run_steps(state, steps)
    rows = [{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/")) and not k.endswith("_s")}
            for row in read_metrics(out)]
    return rows, checkpoints, engine.calls


def probe_prune(cfg: TrainConfig, tmp_path: Path):
    from ada_core.run.checkpoints import mark_complete, prune_checkpoints
    from ada_core.run.files import CHECKPOINTS

    run = tmp_path / f"prune-{len(list(tmp_path.iterdir()))}"
    for step in (2, 4, 6, 8):
        folder = run / CHECKPOINTS / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "weights").write_text(str(step))
        mark_complete(folder)
    prune_checkpoints(run, cfg.checkpoint.keep_last, newest_good=folder)
    return sorted(p.name for p in (run / CHECKPOINTS).iterdir())


def probe_data(cfg: TrainConfig, tmp_path: Path):
    from ada_core.data import run_split

    train, held_out, validation = run_split(cfg.data, cfg.seed)
    return [p.id for p in train], [p.id for p in held_out], [p.id for p in validation]


def probe_sft_draw(cfg: TrainConfig, tmp_path: Path):
    from ada_core.data import warm_start_prompts

    draw = warm_start_prompts(cfg.data.dataset, [], cfg.seed, size=cfg.sft.prompts, carry_slip=cfg.sft.carry_slip)
    return len(draw), [(p.text, p.answer) for p in draw[:200]]


def probe_start(cfg: TrainConfig, tmp_path: Path):
    """Which start a curation of `cfg` begins from (tasks/curation.py): a shipped one or the recipe, and its key."""
    from ada_core.config.schema import data_seed
    from tasks.curation import curation_inputs, curation_key, key_inputs

    inputs, start = key_inputs(**curation_inputs(cfg, data_seed(cfg)))
    return curation_key(inputs), start.key if start is not None else "recipe"


def probe_encode(cfg: TrainConfig, tmp_path: Path):
    from ada_core.data import generate_prompts
    from ada_core.errors import DatasetError
    from ada_core.models.build import build_tiny_tokenizer
    from ada_core.training.state import _encode_within_limit

    prompts = generate_prompts("arithmetic", 12, seed=0)
    try:
        train, held_out, skipped = _encode_within_limit(build_tiny_tokenizer(), prompts[:8], prompts[8:], cfg)
    except DatasetError as err:
        return str(err)
    return [p.id for p in train], [p.id for p in held_out], skipped


def probe_curation(cfg: TrainConfig, tmp_path: Path):
    """What curation is handed (tasks/curation.py) and, on the Bernoulli engine, what it keeps."""
    from ada_core.data import generate_prompts
    from ada_core.data.curation import curate
    from ada_core.models import encode_prompts
    from ada_core.models.build import build_tiny_tokenizer
    from ada_core.rl.rewards import MathVerifier
    from ada_core.sampling.simulate import BernoulliEngine
    from tasks.curation import curation_inputs

    inputs = curation_inputs(cfg, 0)
    rates = np.random.default_rng(0).uniform(0, 1, 30)  # the engine answers "1" with the prompt's rate; "1" is right
    pool = encode_prompts(build_tiny_tokenizer(), [
        dataclasses.replace(p, answer="1", meta={**p.meta, "pass_rate": float(r)})
        for p, r in zip(generate_prompts("arithmetic", 30, seed=0), rates)])
    if "verifier" not in _SHARED:
        _SHARED["verifier"] = MathVerifier()  # its workers start once for the module; closed at its end
    kept = curate(pool, BernoulliEngine(), _SHARED["verifier"], SamplingParams(max_tokens=8), k=inputs["k"],
                  ceiling=inputs["ceiling"], seed=0, band=inputs["keep_pass_rate"])
    return inputs["micro_batch_size"], [p.id for p in kept.prompts]


def _server_line(cfg: TrainConfig, tmp_path: Path):
    from ada_core.engines.factory import _server
    from ada_core.engines.vllm_server import VLLMServerError

    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    try:
        server = _server(cfg, model, tmp_path / "server.log", cfg.rollout.vllm.port, python=sys.executable)
    except VLLMServerError as err:  # e.g. sleep mode asked for on a machine without CUDA
        return str(err)
    args = [("<free port>" if cfg.rollout.vllm.port == 0 and prev == "--port" else a)
            for prev, a in zip(["", *server.args], server.args)]
    return args, server.env["VLLM_CPU_KVCACHE_SPACE"], server.startup_timeout_s


def probe_vllm_server(cfg: TrainConfig, tmp_path: Path):
    return _server_line(cfg, tmp_path)


def probe_vllm_server_on_gpu(cfg: TrainConfig, tmp_path: Path):
    """The command line as a CUDA machine builds it (no GPU is touched: the line is only built)."""
    import ada_core.engines.vllm_server as vllm_server

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_server, "cuda_available", lambda: True)
        return _server_line(cfg, tmp_path)


def probe_vllm_engine(cfg: TrainConfig, tmp_path: Path):
    from ada_core.engines.factory import engine_kwargs
    from ada_core.engines.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine("http://127.0.0.1:9", model_name="probe", **engine_kwargs(cfg))
    try:
        return (engine.concurrency, engine.meter.capacity, engine._client.timeout.read, str(engine._sync_dir.parent),
                engine.sleep_during_update)
    finally:
        engine.close()


def probe_verifier(cfg: TrainConfig, tmp_path: Path):
    """A step's answer checking (`rollout_step` wraps the run's verifier so): an answer that never returns
    (a power tower) is cut by the per-answer timeout (1 s here), or sooner by a smaller step budget."""
    from ada_core.records import Prompt
    from ada_core.rl.rewards import MathVerifier, StepBudget

    if "verifier_1s" not in _SHARED:
        _SHARED["verifier_1s"] = MathVerifier(timeout_s=1.0)  # closed at the module's end
    verifier = StepBudget(_SHARED["verifier_1s"], cfg.verifier.step_budget_s)
    return [v.status.value for v in verifier.verify([(Prompt(id="q", text="?", answer="1"), r"\boxed{9^{9^{9^{9^{9}}}}}")])]


def probe_ledger(cfg: TrainConfig, tmp_path: Path):
    from ada_core.training.state import _start_ledger

    run = tmp_path / f"ledger-{len(list(tmp_path.iterdir()))}"
    run.mkdir()
    ledger = _start_ledger(cfg, run, None, 0)
    if ledger is None:
        return None
    try:
        return ledger.url
    finally:
        ledger.close()


def probe_placement(cfg: TrainConfig, tmp_path: Path):
    from ada_core.engines.rank_worker import placement

    return placement(cfg.distributed)


PROBES = {name.removeprefix("probe_"): fn for name, fn in globals().items() if name.startswith("probe_")}
_SHARED: dict[str, Any] = {}
_DETERMINISTIC: set[str] = set()  # probes already seen to give the same answer twice


@pytest.fixture(scope="module", autouse=True)
def _close_shared():
    yield
    for name in ("verifier", "verifier_1s"):
        if name in _SHARED:
            _SHARED.pop(name).close()


# --- the walk ---------------------------------------------------------------------------------------
def test_every_field_is_declared_and_covered():
    rules = applicability(TrainConfig)
    leaves = set(leaf_fields(TrainConfig))
    problems = []
    for name in sorted(leaves):
        if rules[name] is None:
            problems.append(f"{name}: declares no applicability")
        covered = [kind for kind, table in (("EFFECTS", EFFECTS), ("ELSEWHERE", ELSEWHERE), ("LABELS", LABELS))
                   if name in table]
        if len(covered) != 1:
            problems.append(f"{name}: covered by {covered or 'nothing'} (exactly one of EFFECTS, ELSEWHERE, LABELS)")
        elif rules[name] is not None and (covered == ["LABELS"]) != (rules[name].kind == "label"):
            problems.append(f"{name}: declared {rules[name]} but listed in {covered[0]}")
    for name in sorted({*EFFECTS, *ELSEWHERE, *LABELS} - leaves):
        problems.append(f"{name}: listed in this file but not a config field (renamed? removed?)")
    for name, rule in rules.items():  # every clause names a real field or a run fact
        for clause in rule.clauses if rule is not None else ():
            for path in clause.paths:
                if path not in leaves and path not in RUN_FACTS:
                    problems.append(f"{name}: its clause `{clause}` names {path!r}, which is no field or run fact")
    for name, test_id in ELSEWHERE.items():
        path, _, function = test_id.partition("::")
        if not re.search(rf"^def {re.escape(function)}\(", (ROOT / path).read_text(), re.M):
            problems.append(f"{name}: ELSEWHERE names {test_id}, which does not exist")
    assert not problems, "\n".join(problems) + "\n\n" + WHAT_TO_ADD


@pytest.mark.parametrize("name", sorted(EFFECTS))
def test_each_field_changes_what_a_run_does(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    probe, _, _ = EFFECTS[name]
    base, changed = configs(name, tmp_path)
    rule = applicability(TrainConfig)[name]
    facts = facts_for(name)
    assert rule.holds(base, facts), f"{name}: EFFECTS' base config is one where it does not apply ({rule})"
    first = PROBES[probe](base, tmp_path)
    if probe not in _DETERMINISTIC:  # once per probe: the same config twice gives the same answer
        assert PROBES[probe](copy.deepcopy(base), tmp_path) == first, f"probe {probe!r} is not deterministic"
        _DETERMINISTIC.add(probe)
    assert PROBES[probe](changed, tmp_path) != first, (
        f"{name}: changing it from {_value(base, name)!r} to {_value(changed, name)!r} did not change what probe "
        f"{probe!r} returns; a field that changes nothing must be refused where it cannot apply, or be a label")


def _value(config: TrainConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def test_the_docs_config_table_is_generated_from_the_declarations():
    from ada_core.config.applies import config_table

    table = config_table(TrainConfig)
    assert "| `sampler.window` | `8` | sampler.name == ada and sampler.schedule == streaming |" in table
    assert "| `preset` | `'grpo'` | label |" in table
    assert (ROOT / "docs" / "CONFIG.md").read_text() == table, (
        "docs/CONFIG.md is stale: run `python -m ada_core.config > docs/CONFIG.md`")
