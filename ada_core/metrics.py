"""Metric keys: one scheme for JSONL files, MLflow and reports. `docs/METRICS.md` documents it.

Keys are `namespace/name`, lower-case, using only letters, digits, `_`, `/` and `.` — all
characters MLflow accepts. Cumulative counters end in `_cum`; durations end in `_s`.

The answer comes first: held-out accuracy and the comparable reward live in `accuracy/`, the
namespace MLflow's run page shows first (it orders chart sections by name, and nothing the server
can set changes that: `HEADLINE`). A feature's metrics are logged only while the feature is on
(`WHEN_ON`), so an off feature draws no all-zero charts.
"""

from __future__ import annotations

import re

_KEY = re.compile(r"^[a-z0-9_.]+(/[a-z0-9_.]+)+$")

# sampler/: what the sampler did this step
SAMPLER_EFFECTIVE_RATIO = "sampler/effective_ratio"  # kept groups with a nonzero advantage / prompts drawn
SAMPLER_ALL_CORRECT_FRAC = "sampler/all_correct_frac"  # of prompts drawn, pool all positive
SAMPLER_ALL_WRONG_FRAC = "sampler/all_wrong_frac"  # of prompts drawn, pool all negative
SAMPLER_PROMPTS_DRAWN = "sampler/prompts_drawn"
SAMPLER_GROUPS_KEPT = "sampler/groups_kept"
SAMPLER_ROUNDS = "sampler/rounds"
SAMPLER_UNRESOLVED = "sampler/unresolved"
SAMPLER_UNRESOLVED_NO_POS = "sampler/unresolved_missing_pos"
SAMPLER_UNRESOLVED_NO_NEG = "sampler/unresolved_missing_neg"
SAMPLER_SAMPLES_PER_PROMPT_MEAN = "sampler/samples_per_prompt_mean"
SAMPLER_SAMPLES_PER_PROMPT_MAX = "sampler/samples_per_prompt_max"
SAMPLER_P_HAT_MEAN = "sampler/p_hat_mean"
SAMPLER_CARRIED = "sampler/carried"  # sampler.carry_over: open prompts the step's batch left for later steps
SAMPLER_CARRIED_SAMPLES = "sampler/carried_samples"  # their committed samples, counted in the step they enter a batch
SAMPLER_DROPPED_PROMPTS = "sampler/dropped_prompts"  # rollout.stale: drop: prompts dropped as not done by their bound (and at the last step, those left open)
SAMPLER_DROPPED_PASS_RATE = "sampler/dropped_pass_rate"  # the pass rate of their committed samples (0: none)
SAMPLER_GEN_BATCHES = "sampler/gen_batches"  # dapo
SAMPLER_FELL_BACK = "sampler/fell_back"  # dapo: 1 when the cap was hit before B groups were kept
SAMPLER_TIME_S = "sampler/bookkeeping_s"  # the sampler's own time, engine and verifier excluded
SAMPLER_BUDGET = "sampler/budget"  # budgeted: the step's sample budget
SAMPLER_FORCED = "sampler/explore_forced"  # budgeted: prompts retested by the exploration floor
SAMPLER_EXPECTED_INFORMATIVE = "sampler/expected_informative"  # budgeted: sum of posterior P(mixed pool)
SAMPLER_EST_P_HAT_MIN = "sampler/est_p_hat_min"  # est: the lowest pre-visit pass-rate estimate of the step
SAMPLER_EST_WEIGHT_MAX = "sampler/est_weight_max"  # est: the largest 1/sqrt(r_bar + eps) of a mixed pool (1 = none)


def active_prompts_key(round_index: int) -> str:
    """Prompts still active at the start of round `round_index` (0-based)."""
    return f"sampler/active_round_{round_index}"


def exit_reason_key(reason: str) -> str:
    return f"sampler/exit_{reason}"


def verifier_status_key(status: str) -> str:
    return f"verifier/{status}"


# budget/: what the step spent; `_cum` are run totals
BUDGET_GENERATED_SAMPLES = "budget/generated_samples"
BUDGET_GENERATED_TOKENS = "budget/generated_tokens"
BUDGET_TRAINED_SAMPLES = "budget/trained_samples"
BUDGET_TRAINED_TOKENS = "budget/trained_tokens"
BUDGET_GENERATED_SAMPLES_CUM = "budget/generated_samples_cum"
BUDGET_GENERATED_TOKENS_CUM = "budget/generated_tokens_cum"
BUDGET_TRAINED_SAMPLES_CUM = "budget/trained_samples_cum"
BUDGET_TRAINED_TOKENS_CUM = "budget/trained_tokens_cum"
BUDGET_COMMITTED_TOKENS = "budget/committed_tokens"  # tokens of the samples in the pools
BUDGET_ABORTED_TOKENS = "budget/aborted_tokens"  # streaming: tokens of samples aborted past a pool's prefix
BUDGET_ABORTED_SAMPLES = "budget/aborted_samples"  # streaming: samples started, then aborted (not samples)
BUDGET_DROPPED_SAMPLES = "budget/dropped_samples"  # sampler.carry_over: samples in flight a resume could not keep
BUDGET_DROPPED_TOKENS = "budget/dropped_tokens"  # the tokens of those of them that were back from the server
BUDGET_LOGPROB_TOKENS = "budget/logprob_tokens"  # tokens whose log-probs were recomputed (no grad)
BUDGET_LOGPROB_TOKENS_CUM = "budget/logprob_tokens_cum"

# time/: wall-time split of a step
TIME_GENERATE_S = "time/generate_s"
TIME_REWARD_S = "time/reward_s"
TIME_REWARD_OVERLAP_S = "time/reward_overlap_s"  # streaming: the part of reward_s spent while generating
TIME_UPDATE_S = "time/update_s"
TIME_SYNC_S = "time/sync_s"  # weight sync to an out-of-process engine, plus sleep/wake-up when on
TIME_OVERLAP_S = "time/overlap_s"  # rollout.async_steps: update time during which the servers were drawing
TIME_STEP_S = "time/step_s"
TIME_ELAPSED_S = "time/elapsed_s"  # run wall time so far
TIME_EVAL_S = "time/eval_s"  # one evaluation (held-out, validation, suite), on its eval row; not in step_s or elapsed_s
TIME_SETUP_S = "time/setup_s"  # the run's (or the resume's) set-up before its first step: data, start model, engines;
# on the first step's row after it

# sync/: the once-per-step weight sync to a vLLM server (absent with the in-process engine)
SYNC_WRITE_S = "sync/write_s"  # writing the safetensors to the sync folder
SYNC_RELOAD_S = "sync/reload_s"  # pause, reload_weights, reset_prefix_cache, version, resume
SYNC_WEIGHT_VERSION = "sync/weight_version"  # the version the server now serves (= the step)
SYNC_FROZEN_SAMPLES = "sync/frozen_samples"  # rollout.partial_rollout: samples in flight at the load, resumed after it

# rollout/: the vLLM servers behind the rollout engine (rollout.vllm.num_servers or base_urls)
ROLLOUT_NUM_SERVERS = "rollout/num_servers"  # servers the engine was built with
ROLLOUT_SERVERS_ALIVE = "rollout/servers_alive"  # of them, still serving at the end of the step (every row)

# accuracy/: the answer a run gives, first on MLflow's run page (HEADLINE); eval/avg_at_k and reward/mean before
HEADLINE = "accuracy"
EVAL_AVG_AT_K = f"{HEADLINE}/heldout_avg_at_k"  # held-out accuracy: mean over k samples a prompt (the paper's Ave@k)
EVAL_PASS_AT_K = f"{HEADLINE}/heldout_pass_at_k"  # held-out prompts with a correct sample among k
REWARD_MEAN = f"{HEADLINE}/reward_mean"  # round-1 mean reward per SAMPLE: reads low for a sampler that puts more samples on hard prompts
REWARD_PROMPT_MEAN = f"{HEADLINE}/reward_prompt_mean"  # mean over prompts of each one's round-1 pass rate: compares across samplers
VAL_AVG_AT_K = f"{HEADLINE}/val_avg_at_k"  # validation accuracy (data.val_size): what picks a comparison's best policy
VAL_PASS_AT_K = f"{HEADLINE}/val_pass_at_k"
BEST_EVAL_AVG_AT_K = f"{HEADLINE}/best_heldout_avg_at_k"  # a compare/sweep parent: its best child's final held-out accuracy

# Budget axes (MLflow only): accuracy and reward again, with MLflow's step the budget spent, on a grid every run
# shares (flows/tracking/budget.py); their sections sort right after accuracy/.
VS_SAMPLES = f"{HEADLINE}/vs_samples"  # step = cumulative generated samples
VS_MFLOPS = f"{HEADLINE}/vs_mflops"  # step = estimated compute in MFLOPs (1e6 FLOPs: int64 steps hold 9e24 FLOPs)


def budget_axis_key(axis: str, key: str) -> str:
    """`accuracy/heldout_avg_at_k` on the `VS_SAMPLES` axis: `accuracy/vs_samples/heldout_avg_at_k`."""
    return f"{axis}/{key.rsplit('/', 1)[-1]}"


# reward/ and response/
REWARD_TRAINED_MEAN = "reward/trained_mean"  # mean reward of the kept groups
RESPONSE_LENGTH_MEAN = "response/length_mean"
RESPONSE_TRUNCATED_FRAC = "response/truncated_frac"

# train/: the update
TRAIN_LOSS = "train/loss"
TRAIN_ENTROPY = "train/entropy"
TRAIN_CLIP_FRAC = "train/clip_frac"
TRAIN_APPROX_KL = "train/approx_kl"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_LR = "train/lr"
TRAIN_KL_REF = "train/kl_ref"

# update/: the update engine's own diagnostics and time split
UPDATE_OLD_LOGPROB_GAP_MEAN = "update/old_logprob_gap_mean"  # mean |behaviour - recomputed old| log-prob
UPDATE_OLD_LOGPROB_GAP_MAX = "update/old_logprob_gap_max"  # max over tokens of the same
UPDATE_IS_RATIO_MEAN = "update/is_ratio_mean"  # token mean of exp(old - behaviour)
UPDATE_IS_RATIO_MAX = "update/is_ratio_max"  # token max of exp(old - behaviour)
UPDATE_TIS_CLIP_FRAC = "update/tis_clip_frac"  # share of trained tokens whose TIS weight hit loss.tis_cap
UPDATE_OPTIMIZER_STEPS = "update/optimizer_steps"  # optimizer steps taken this step
UPDATE_RECOMPUTE_S = "update/recompute_s"  # old (and reference) log-prob recompute
UPDATE_OLD_RECOMPUTED = "update/old_recomputed"  # 1: a no-grad forward gave the old log-probs; 0: the update was one
# optimizer step, whose own forward (detached) is the old policy's (update_plan.old_is_current)
UPDATE_OPTIMIZE_S = "update/optimize_s"  # forward/backward/optimizer steps

# dist/: the ranks of the update (distributed.num_ranks; world size 1 is the in-process engine)
DIST_WORLD_SIZE = "dist/world_size"  # training ranks
DIST_RANK_UPDATE_MAX_S = "dist/rank_update_max_s"  # the slowest rank's recompute + optimize time this step
DIST_RANK_UPDATE_MIN_S = "dist/rank_update_min_s"  # the fastest rank's; max - min is time lost to imbalance

THROUGHPUT_GEN_TOKENS_PER_S = "throughput/gen_tokens_per_s"

# rollout/: how the rollout server was used
ROLLOUT_IDLE_FRACTION = "rollout/idle_fraction"  # share of generation time below rollout.vllm.concurrency
ROLLOUT_UNUSED_SLOT_FRACTION = "rollout/unused_slot_fraction"  # 1 - mean sequences in flight / concurrency


def server_idle_key(index: int) -> str:
    """Share of the step's wall time (last step's end to this one's) with nothing in flight on server `index`."""
    return f"rollout/server_{index}/idle_fraction"


# async/: rollout.async_steps (docs/ALGORITHM.md, Asynchronous rollout)
ASYNC_STEPS = "async/steps"  # rollout.async_steps: the staleness bound k
ASYNC_POLICY_VERSION = "async/policy_version"  # weight version the step's batch was drawn with
ASYNC_STALENESS_MEAN = "async/staleness_mean"  # drawn samples: updates between their policy and the update's old one
ASYNC_STALENESS_MAX = "async/staleness_max"  # never more than async/steps
ASYNC_WAIT_S = "async/wait_s"  # the trainer waiting for its batch (0 when generation hid behind the update)
# rollout.partial_rollout: staleness per generated token (a sample can span versions)
ASYNC_TOKEN_STALENESS_MEAN = "async/token_staleness_mean"  # drawn tokens: updates between their policy and the old one
ASYNC_TOKEN_STALENESS_MAX = "async/token_staleness_max"  # never more than async/steps
ASYNC_SPANNING_SAMPLES = "async/spanning_samples"  # drawn samples whose tokens come from two or more versions


def token_staleness_key(age: int) -> str:
    """rollout.partial_rollout: the share of the step's drawn tokens `age` updates old (0 .. async/steps): the
    histogram of token versions."""
    return f"async/tokens_stale_{age}"


# Keys as runs wrote them before accuracy/ (metrics.jsonl and result.json of older run folders): read as today's.
RENAMED = {"eval/avg_at_k": EVAL_AVG_AT_K, "eval/pass_at_k": EVAL_PASS_AT_K, "reward/mean": REWARD_MEAN}


def current_names(row: dict[str, float]) -> dict[str, float]:
    """`row` with every key an older run wrote under a since-renamed name (`RENAMED`) under today's."""
    return {RENAMED.get(k, k): v for k, v in row.items()}


# Families a run logs only while their feature is on: the clause (ada_core/config/applies.py's language) that says
# it is on, and its keys. Off, they would be all zero (async/*, the streaming counts, the KL term, unresolved
# prompts of a sampler that has none) or restate another metric (dist/* of the one in-process rank).
WHEN_ON: dict[str, tuple[str, ...]] = {
    "rollout.async_steps > 0": (ASYNC_STEPS, ASYNC_POLICY_VERSION, ASYNC_STALENESS_MEAN, ASYNC_STALENESS_MAX,
                                ASYNC_WAIT_S, TIME_OVERLAP_S),
    "rollout.partial_rollout == true": (ASYNC_TOKEN_STALENESS_MEAN, ASYNC_TOKEN_STALENESS_MAX, ASYNC_SPANNING_SAMPLES,
                                        SYNC_FROZEN_SAMPLES),
    "sampler.schedule == streaming": (BUDGET_ABORTED_TOKENS, BUDGET_ABORTED_SAMPLES, TIME_REWARD_OVERLAP_S),
    "sampler.carry_over == true": (SAMPLER_CARRIED, SAMPLER_CARRIED_SAMPLES, BUDGET_DROPPED_SAMPLES,
                                   BUDGET_DROPPED_TOKENS),
    "rollout.stale == drop": (SAMPLER_DROPPED_PROMPTS, SAMPLER_DROPPED_PASS_RATE),
    "loss.kl_coef > 0": (TRAIN_KL_REF,),
    "distributed.num_ranks > 1": (DIST_WORLD_SIZE, DIST_RANK_UPDATE_MAX_S, DIST_RANK_UPDATE_MIN_S),
    "sampler.name in [ada, budgeted, est]": (SAMPLER_UNRESOLVED, SAMPLER_UNRESOLVED_NO_POS, SAMPLER_UNRESOLVED_NO_NEG),
}


def is_valid_key(key: str) -> bool:
    return bool(_KEY.match(key))


def check_keys(metrics: dict[str, float]) -> dict[str, float]:
    """Raise if any key breaks the scheme; return the dict for chaining."""
    bad = [k for k in metrics if not is_valid_key(k)]
    if bad:
        raise ValueError(f"metric keys outside the namespace/name scheme: {bad}")
    return metrics
