"""(a) of benchmarks/async_rollout.py: the discrete-event server model with the update and the weight
sync, at the paper's two shapes, for GRPO and Ada-balance under rounds / streaming / streaming + async,
colocated and on separate GPUs.

Generation: benchmarks/streaming_model.py's continuously batching server (GPU-like: a = 10 ms,
c = 0.05 ms per running sequence, 256 slots), 512 prompts split over the servers (one per rollout
GPU), median 600 tokens, Ada-balance M=8, N=4, n=4; a step's generation is its slowest server's.

Calibration: the model's own token mix makes Ada-balance's rounds generation 5.5x GRPO's, while the
paper measured 2.8x GRPO's *step* (1.5B) and 1.59x (7B). So each method's model seconds are scaled
once, on 8 colocated servers under its paper schedule, to the paper's generation seconds (step minus
update): GRPO (102 - 15) s and Ada-balance rounds (2.8 x 102 - 15) s at 1.5B; (236 - 85) s and
(1.59 x 236 - 85) s at 7B. Every other row applies the same factor to the model's seconds, so what
the rows show is the model's change (streaming, fewer servers), at the paper's absolute scale.

Step time:
- sync, colocated (all 8 GPUs serve, then all 8 train):  gen(8) + update + sync_colocated
- sync, separate GPUs (r serve, 8 - r train):            gen(r) + update x 8/(8-r) + sync
- async_steps=1, colocated: our design loads weights between batches and the update needs the
  GPUs the servers hold, so nothing overlaps: the same as sync, colocated
- async_steps=1, separate GPUs:                          max(gen(r) + sync_load, update x 8/(8-r) + write)
  with the best split r in 1..7 (the update scales linearly in trainer GPUs: optimistic for async)
- bound, "tail filled": streaming whose next batch enters the slots the last one's tail leaves
  free, colocated: the model's streaming seconds / its floor ratio x floor; a design we do not run
  (it needs a weight change with samples in flight), shown as what is left on the table

    python benchmarks/async_rollout_model.py        # JSON on stdout (~30 s)
"""

from __future__ import annotations

import heapq
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from streaming_model import STREAM_REDO_TOKENS, Server, Sim, draw_step, run_schedule

from ada_core.sampling.streaming import StreamSchedule

from ada_core.config import SamplerConfig

GPU_LIKE = Server(0.010, 0.00005, 256)
SHAPES = {  # the paper's 8xH100 step times (Reinforce-Ada, arXiv 2510.04996)
    "qwen2.5-math-1.5b": {"grpo_step_s": 102.0, "update_s": 15.0, "ada_vs_grpo": 2.8, "sync_s": 1.0},
    "qwen2.5-math-7b": {"grpo_step_s": 236.0, "update_s": 85.0, "ada_vs_grpo": 1.59, "sync_s": 3.0},
}
# sync_s: a weight load to servers on other GPUs (bf16 weights over NVLink, ~2 and ~14 GB); ours. Colocated
# (verl's hybrid engine) resharding is inside the paper's step already.


def gen_seconds(schedule: str, servers: int, prompts=512, seed=0, window=8) -> dict:
    cfg = SamplerConfig(name="ada", exit_rule="balance", n=4, M=8, N=4)
    lengths, rewards = draw_step(prompts, cfg.max_samples_per_prompt, 600, 0.8, 2048, seed)
    times, tokens = [], 0
    for shard in np.array_split(np.arange(prompts), servers):
        sim, _ = run_schedule(schedule, GPU_LIKE, lengths[shard], rewards[shard], cfg, window)
        times.append(sim.now)
        tokens += sim.tokens
    floor = tokens / servers / GPU_LIKE.floor_tokens_per_s
    return {"s": max(times), "floor_s": floor}


# Partial rollout and carry-over: the 8 servers as one merged server (8 x 256 slots, iteration a + (c / 8) x
# running: 8 servers each running 1/8 of the sequences), so a step's batch (512 groups) fills from the whole
# fleet, as a global batch does; the servers are frozen while the trainer updates (colocated).
MERGED = Server(GPU_LIKE.a, GPU_LIKE.c / 8, GPU_LIKE.max_seqs * 8)


def carry_over_seconds(method: str, carry: bool, steps=12, prompts=512, window=8, seed=0) -> dict:
    """Generation seconds per step of `steps` steps of `prompts` groups each, on the merged server.

    carry=False: today's: a step draws its `prompts` prompts and its stream runs until every one is
    resolved, its tail included.
    carry=True (partial rollout + carry-over): the next step's prompts enter the stream as soon as the
    server has a free slot (this step's tail), and a step ends once `prompts` groups are ready (a prompt
    that exited or reached its maximum; GRPO: all n samples back), taken in prompt order (an older step's
    prompts first); the rest keep their pools and their samples in flight, frozen through the update, and
    go on after it; each sample frozen redoes STREAM_REDO_TOKENS tokens after the load. At most one
    step's prompts are drawn ahead. Steady state: the mean over steps 3..`steps` (step lengths alternate while the carry settles)."""
    cfg = SamplerConfig(name="ada", exit_rule="balance", n=4, M=8, N=4)
    sim = Sim(MERGED)
    live: dict[int, tuple] = {}  # drawn step -> (schedule, or GRPO's samples back per prompt; lengths; rewards)
    ready: set[tuple[int, int]] = set()
    step = 0

    def launch(s: int) -> None:
        schedule, lengths, _ = live[s]
        for i, j0, count in schedule.starts():
            for j in range(j0, j0 + count):
                sim.submit((s, i, j), int(lengths[i, j]))

    def draw(s: int) -> None:
        lengths, rewards = draw_step(prompts, cfg.max_samples_per_prompt, 600, 0.8, 2048, seed + s)
        if method == "grpo":
            live[s] = ([0] * prompts, lengths, rewards)
            for i in range(prompts):
                for j in range(cfg.n):
                    sim.submit((s, i, j), int(lengths[i, j]))
        else:
            live[s] = (StreamSchedule(prompts, cfg, window, MERGED.max_seqs), lengths, rewards)
            launch(s)

    def on_done(key) -> None:
        s, i, j = key
        schedule, _, rewards = live[s]
        if method == "grpo":
            schedule[i] += 1
            if schedule[i] == cfg.n:
                ready.add((s, i))
        else:
            _, aborted = schedule.finished(i, j, bool(rewards[i, j]))
            for k in aborted:
                sim.cancel((s, i, k))
            if schedule.exited[i] or schedule.committed[i] >= cfg.max_samples_per_prompt:
                ready.add((s, i))
            launch(s)
        if carry and step + 1 not in live and len(sim.running) + len(sim.queue) < MERGED.max_seqs:
            draw(step + 1)  # the tail leaves slots free: the next step's prompts start in them

    times, ages = [], []
    for step in range(steps):
        if step not in live:
            draw(step)
        start = sim.now
        sim.run(on_done, until=(lambda: len(ready) >= prompts) if carry else None)
        take = sorted(ready)[:prompts]
        ready.difference_update(take)
        ages.extend(step - s for s, _ in take)
        times.append(sim.now - start)
        if carry:  # the load: each sample in flight redoes the tokens it had not streamed yet
            for key, (begun, length) in list(sim.running.items()):
                sim.running[key] = (begun, length + STREAM_REDO_TOKENS)
            sim.finish_heap = [(sim.running[k][0] + sim.running[k][1], k) for _, k in sim.finish_heap
                               if k in sim.running]
            heapq.heapify(sim.finish_heap)
    steady = times[2:]
    return {"gen_s_per_step": float(np.mean(steady)), "gen_s_steps": times, "tokens": sim.tokens,
            # a group's batch minus the step it was drawn for: > 0 carried over, < 0 drawn ahead and ready first
            "carried_share": float(np.mean([a > 0 for a in ages])), "drawn_ahead_share": float(np.mean([a < 0 for a in ages])),
            "carried_steps_max": int(max(ages))}


def carry_rows(shape: dict, model: dict, merged: dict) -> dict:
    """Each shape's step with partial rollout + carry-over against today's streaming, both on the merged
    server, scaled to the paper's seconds by the per-shard model's calibration (shape_rows)."""
    update, grpo_sync = shape["update_s"], shape["grpo_step_s"]
    scale = {"grpo": (grpo_sync - update) / model[("grpo", 8)]["s"],
             "ada": (shape["ada_vs_grpo"] * grpo_sync - update) / model[("rounds", 8)]["s"]}
    rows = {}
    for method in ("grpo", "streaming"):
        factor = scale["grpo" if method == "grpo" else "ada"]
        name = "grpo" if method == "grpo" else "ada-balance streaming"
        today = factor * merged[(method, False)]["gen_s_per_step"] + update
        carried = factor * merged[(method, True)]["gen_s_per_step"] + update
        rows[name] = {"today_merged_s": today, "partial_carry_s": carried,
                      "today_merged_vs_grpo_sync": today / grpo_sync, "partial_carry_vs_grpo_sync": carried / grpo_sync,
                      **{k: merged[(method, True)][k] for k in ("carried_share", "drawn_ahead_share", "carried_steps_max")}}
    return rows


def model_seconds() -> dict:
    return {(m, r): gen_seconds(m, r) for m in ("grpo", "rounds", "streaming") for r in range(1, 9)}


def shape_rows(shape: dict, model: dict) -> dict:
    update, sync = shape["update_s"], shape["sync_s"]
    grpo_sync = shape["grpo_step_s"]
    scale = {"grpo": (grpo_sync - update) / model[("grpo", 8)]["s"],
             "ada": (shape["ada_vs_grpo"] * grpo_sync - update) / model[("rounds", 8)]["s"]}

    def gen(method: str, schedule: str, r: int) -> float:
        return scale["grpo" if method == "grpo" else "ada"] * model[(schedule, r)]["s"]

    rows = {}
    for method, schedules in (("grpo", ("grpo",)), ("ada-balance", ("rounds", "streaming"))):
        for schedule in schedules:
            name = f"{method} {schedule}" if method != "grpo" else "grpo"
            colocated = gen(method, schedule, 8) + update
            split = {r: gen(method, schedule, r) + update * 8 / (8 - r) + sync for r in range(1, 8)}
            overlapped = {r: max(gen(method, schedule, r) + sync, update * 8 / (8 - r)) for r in range(1, 8)}
            best_sync, best_async = min(split, key=split.get), min(overlapped, key=overlapped.get)
            rows[name] = {
                "generation_s_8_gpus": gen(method, schedule, 8),
                "sync_colocated_s": colocated,
                "sync_separate_s": split[best_sync], "sync_separate_rollout_gpus": best_sync,
                "async1_colocated_s": colocated,
                "async1_separate_s": overlapped[best_async], "async1_separate_rollout_gpus": best_async,
            }
            if schedule == "streaming":
                floor = scale["ada"] * model[("streaming", 8)]["floor_s"]
                rows[name]["tail_filled_colocated_bound_s"] = floor + update
    for row in rows.values():
        for key in [k for k in row if k.endswith("_s") and not k.startswith("generation")]:
            row[key[:-2] + "_vs_grpo_sync"] = row[key] / grpo_sync
    best_ada = min(v for k, v in rows["ada-balance streaming"].items() if k.endswith("_s") and "bound" not in k
                   and not k.startswith("generation"))
    return {"scale_model_s_to_paper_s": scale, "rows": rows, "best_ada_vs_grpo_sync": best_ada / grpo_sync}


def main() -> None:
    started = time.perf_counter()
    model = model_seconds()
    out = {name: shape_rows(shape, model) for name, shape in SHAPES.items()}
    merged = {(m, carry): carry_over_seconds(m, carry) for m in ("grpo", "streaming") for carry in (False, True)}
    for name, shape in SHAPES.items():
        out[name]["partial_rollout_carry_over"] = carry_rows(shape, model, merged)
    out["partial_rollout_merged_model"] = {f"{m} {'carry' if c else 'today'}": v for (m, c), v in merged.items()}
    out["assumptions"] = {"server": {"a_s": GPU_LIKE.a, "c_s": GPU_LIKE.c, "max_seqs": GPU_LIKE.max_seqs},
                          "shapes": SHAPES, "window": 8, "prompts": 512, "length_median": 600, "sigma": 0.8}
    out["wall_s"] = time.perf_counter() - started
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
