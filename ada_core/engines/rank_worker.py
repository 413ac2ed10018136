"""One training rank as a Ray actor (`RankWorker`), and where the rank group places the ranks.

Each actor sends its stdout and stderr to its log (`<log_dir>/rank_<r>.log`), takes the environment
the rank group gives it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and, on one machine,
ADA_DIST_RENDEZVOUS), loads the model folder, and builds its own DeepSpeedUpdateEngine (with the
reference policy when `loss.kl_coef > 0`) and an in-process rollout engine on the same weights. The
group's calls (recompute, train_steps, generate, save, load) go straight to those; `write_weights`
hands the driver the current weights through a file.

`placement` gives the placement group's bundles and strategy; `driver_node_ip` and `NODE_PIN` pin
bundle 0 to the driver's node, where rank 0 writes those weights (/dev/shm).

Apart from the group (rank_group.py, the driver's side) because the actor runs in each rank's own
process; the placement helpers come with it because they say where those processes go.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ada_core.engines.deepspeed_engine import DeepSpeedUpdateEngine
from ada_core.engines.update_state import load_reference
from ada_core.paths import staged
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt, Sample

log = logging.getLogger(__name__)


class RankWorker:
    """One training rank (a Ray actor): a DeepSpeedUpdateEngine in world `world_size`, and an
    in-process rollout engine on the same weights."""

    def __init__(self, rank: int, world_size: int, log_path: str):
        self.rank, self.world_size = rank, world_size
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                            format=f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s")
        self.engine: DeepSpeedUpdateEngine | None = None
        self.rollout = None

    def address(self) -> tuple[str, int, str]:
        """(node IP, a free port on it, node id): rank 0's is the rendezvous."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            port = s.getsockname()[1]
        return ip, port, ray.get_runtime_context().get_node_id()

    def setup(self, env: dict[str, str], model_dir: str, loss_cfg, optim_cfg, engine_kwargs: dict[str, Any],
              rollout_micro_batch_size: int, reference_dir: str | None = None) -> int:
        from ada_core.engines.transformers_engine import TransformersRolloutEngine
        from ada_core.models import load_policy

        os.environ.update(env)
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        import ray

        log.info("rank %d of %d on %s: loading %s (MASTER %s:%s)", self.rank, self.world_size,
                 ray.util.get_node_ip_address(), model_dir, env["MASTER_ADDR"], env["MASTER_PORT"])
        model, tokenizer = load_policy(model_dir)
        ref_model = load_reference(reference_dir) if reference_dir is not None else None
        self.engine = DeepSpeedUpdateEngine(model, loss_cfg, optim_cfg, ref_model=ref_model, **engine_kwargs)
        if self.engine.world_size != self.world_size:
            raise RuntimeError(f"rank {self.rank} joined a process group of {self.engine.world_size} ranks, "
                               f"expected {self.world_size}")
        self.rollout = TransformersRolloutEngine(self.engine.module, tokenizer, micro_batch_size=rollout_micro_batch_size)
        return os.getpid()

    def recompute(self, seqs: list[dict]) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None]], float]:
        start = time.perf_counter()
        self.engine.recompute(seqs)
        return [(s["old"], s["ref"]) for s in seqs], time.perf_counter() - start

    def recompute_reference(self, seqs: list[dict]) -> tuple[list[torch.Tensor | None], float]:
        """An update of one optimizer step: only the frozen reference's log-probs (none without a KL term)."""
        start = time.perf_counter()
        self.engine.recompute(seqs, old=False)
        return [s["ref"] for s in seqs], time.perf_counter() - start

    def train_steps(self, steps, old_is_current: bool = False):
        """(results, seconds), and with `old_is_current` the old log-probs the one step's forward gave each
        sequence of this rank's share, in share order (the driver's off-policy metrics read them)."""
        results, seconds = self.engine.train_steps(steps, old_is_current=old_is_current)
        if not old_is_current:
            return results, seconds
        return results, seconds, [s["old"] for s in steps[0][0] if s.get("keep", True)]

    def generate(self, requests: list[tuple[Prompt, int]], sampling: SamplingParams, offset: int) -> list[list[Sample]]:
        return self.rollout.generate(requests, sampling, request_offset=offset)

    def lr(self) -> float:
        return self.engine._lr()

    def save(self, directory: str) -> None:
        self.engine.save(directory)

    def load(self, directory: str, every_rank: list[str]) -> None:
        self.engine.load(directory, every_rank=every_rank)

    def write_weights(self, path: str) -> None:
        """The current weights to `path` (torch.save keeps tied tensors tied); written, then renamed.
        A full disk (/dev/shm is memory) is one DiskFull line, the partial file removed."""
        tensors = {k: v.detach().cpu() for k, v in self.engine.module.state_dict().items()}
        needs = sum(t.numel() * t.element_size() for t in tensors.values())
        with staged(f"{path}.tmp", "the weights for the driver", needs) as tmp:
            torch.save(tensors, tmp)
        os.replace(tmp, path)


def placement(distributed) -> tuple[list[dict[str, float]], str]:
    """The placement group's bundles (one per rank: `cpus_per_rank`, `gpus_per_rank`) and strategy."""
    bundle = {"CPU": distributed.cpus_per_rank,
              **({"GPU": distributed.gpus_per_rank} if distributed.gpus_per_rank > 0 else {})}
    return [dict(bundle) for _ in range(distributed.num_ranks)], distributed.placement_strategy


# The share of a node's `node:<ip>` resource (1 per node, Ray's own) that pins bundle 0 to the driver's node.
NODE_PIN = 0.001


def driver_node_ip() -> str | None:
    """The IP of the Ray node this driver runs on (its `node:<ip>` resource), or None if Ray does not say."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("Alive", True):
            return node.get("NodeManagerAddress")
    return None
