"""N DeepSpeed training ranks as Ray actors, behind the same interface as one `DeepSpeedUpdateEngine`.

The driver (the process running `ada_core.training`) holds the loop; `RankGroup` stands for the
ranks. Built in one place (`RankGroup.__init__`), torn down in one place (`close`):

1. Ray: with `distributed.ray_address` None a local Ray is started on this machine with no dashboard,
   usage stats off, token authentication on (Ray's default) and a 1 GiB object store (weights never go through it: ranks load the model
   folder from disk, and the driver pulls new weights through a file); otherwise the group joins
   the cluster at that address (ray_cluster.start_ray). A Ray this group started is stopped by `close`, or, if the driver
   dies first (SIGKILL included), within a second by a lifeline watcher (lifeline.py) that kills
   every process of that Ray and removes the group's /dev/shm folder.
2. One placement group of `num_ranks` bundles (`cpus_per_rank`, `gpus_per_rank`: rank_worker.placement),
   placed with `placement_strategy`; a group that cannot be placed within `startup_timeout_s` is an
   error that shows the cluster's resources.
3. One `RankWorker` actor (rank_worker.py) per bundle. Rank 0 picks the rendezvous port on its node;
   every rank gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, then builds its own DeepSpeedUpdateEngine
   (gloo on CPU, nccl on CUDA), with the frozen reference policy loaded from `reference_dir` when
   `loss.kl_coef > 0` (the run's initial weights; like the model folder, on a shared file system).
   With every rank on one machine they meet in a file store there and torch listens on loopback
   alone (`ADA_DIST_RENDEZVOUS`, rendezvous.rendezvous_method); across machines, on rank 0's
   node IP (a TCPStore), each rank's gloo/NCCL sockets on the interface that reaches it. Each rank's
   stdout and stderr go to `<log_dir>/rank_<r>.log`.

An update is two rounds of actor calls: every rank recomputes the old log-probs of its share of the
step's sequences, then every rank runs the planned optimizer steps (`update_plan`) on its share of
each mini-batch with the global denominators. A rank that dies or raises fails the step with a
`RankError` naming the rank and showing the last lines of its log.

With the transformers rollout engine, `rollout_engine()` is a `RolloutEngine` that splits each
round's requests across the ranks (each samples on its own copy of the weights, which data
parallelism keeps identical), seeded by the global request index, so the samples are the ones one
rank would draw.

`module` is the driver's copy of the model, refreshed from rank 0 (through a file in /dev/shm)
when an update has changed the weights since: the checkpoint's `save_pretrained` and the vLLM weight
sync read it. Rank 0 is therefore always placed on the driver's node (bundle 0 asks for a share of
that node's `node:<ip>` resource, whatever `placement_strategy`). Across nodes each rank's gloo/NCCL
traffic goes through the interface that reaches rank 0's address (rendezvous.route_interface),
and a rank that is lost is named with its node's IP (`rank_hosts`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ada_core.engines.rank_worker import NODE_PIN, RankWorker, driver_node_ip, placement
from ada_core.engines.rendezvous import RENDEZVOUS_ENV
from ada_core.engines.update_plan import (balance_by_tokens, flatten, local_steps, old_is_current, plan_update,
                                          update_metrics, zero_metrics)
from ada_core.engines.lifeline import Lifeline, descendants
from ada_core.engines.ray_cluster import start_ray
from ada_core.engines.update_state import STATE_FILE, check_world_size, load_state, save_state
from ada_core.errors import RunFailure
from ada_core.protocols import SamplingParams, UpdateEngine
from ada_core.records import Group

log = logging.getLogger(__name__)

_LOG_TAIL_LINES = 30


class RankError(RunFailure):
    """A training rank died, raised, or did not answer. The first line (`summary`, what the CLI prints)
    names the rank and its log; the lines after it hold the log's tail."""


class RankGroup(UpdateEngine):
    """`num_ranks` RankWorker actors in one placement group; the update engine the trainer sees."""

    def __init__(self, module, model_dir: str | Path, loss_cfg, optim_cfg, distributed, *, total_steps: int,
                 pad_token_id: int, log_dir: str | Path, seed: int = 0, temperature: float = 1.0,
                 max_response_len: int | None = None, rollout_micro_batch_size: int = 64,
                 reference_dir: str | Path | None = None):
        if distributed.num_ranks < 2:
            raise ValueError("RankGroup needs distributed.num_ranks >= 2; one rank runs in-process")
        if optim_cfg.zero_stage == 3:
            raise ValueError("optim.zero_stage=3 partitions the parameters, so ranks could not sample or save "
                             "full weights; use stage 0, 1 or 2")
        self.loss_cfg, self.optim_cfg, self.distributed = loss_cfg, optim_cfg, distributed
        self.num_ranks = distributed.num_ranks
        self.max_response_len = max_response_len
        self.log_dir = Path(log_dir)
        self._module = module
        self._shuffle = torch.Generator().manual_seed(seed)
        self._steps = 0  # optimizer steps taken (the same on every rank)
        self._version = self._pulled = 0  # updates done / the update the driver's copy reflects
        self._started_ray = False
        self._pg = None
        self._actors: list[Any] = []
        self._ray_pids: list[int] = []
        self.rank_pids: list[int] = []
        self.rank_hosts: list[str] = []  # each rank's node IP, named when a rank is lost
        self._reference_dir = str(reference_dir) if reference_dir is not None else None
        self._weights_dir = Path(tempfile.mkdtemp(prefix="ada-rank-weights-", dir=_shm_root()))
        # Ends the local Ray this group starts, and removes the weights folder, if the driver dies.
        self._lifeline = Lifeline([self._weights_dir], self.log_dir / "lifeline.log")
        engine_kwargs = dict(total_steps=total_steps, pad_token_id=pad_token_id, seed=seed, temperature=temperature,
                             max_response_len=max_response_len)
        try:
            self._start(str(model_dir), engine_kwargs, rollout_micro_batch_size)
        except BaseException:
            self.close()
            raise

    # --- lifecycle -------------------------------------------------------------------------------

    def _start(self, model_dir: str, engine_kwargs: dict[str, Any], rollout_micro_batch_size: int) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cfg, started = self.distributed, time.perf_counter()
        if cfg.ray_address is None and not ray.is_initialized() and cfg.gpus_per_rank > 0:
            need, have = cfg.gpus_per_rank * self.num_ranks, torch.cuda.device_count()
            if need > have:  # a local Ray only has this machine's GPUs: fail now, not after the placement timeout
                raise RankError(f"distributed: {self.num_ranks} ranks x gpus_per_rank={cfg.gpus_per_rank:g} need "
                                f"{need:g} GPUs, this machine has {have}; lower distributed.num_ranks or gpus_per_rank")
        self._started_ray = start_ray(cfg, env=self._lifeline.env())
        if self._started_ray:
            node = ray._private.worker._global_node
            self._ray_pids = [p.process.pid for infos in (node.all_processes if node else {}).values() for p in infos]
            self._lifeline.watch(descendants(self._ray_pids))
        bundles, strategy = placement(cfg)
        bundle = dict(bundles[0])
        driver_ip = driver_node_ip()
        if driver_ip is not None:  # rank 0 hands the driver its weights through /dev/shm: on the driver's node
            bundles[0][f"node:{driver_ip}"] = NODE_PIN
        self._pg = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([self._pg.ready()], timeout=cfg.startup_timeout_s)
        if not ready:
            raise RankError(f"distributed: a placement group of {self.num_ranks} ranks x {bundle} "
                            f"({cfg.placement_strategy}, rank 0 on the driver's node {driver_ip}) could not be placed "
                            f"within {cfg.startup_timeout_s:.0f}s; the Ray cluster has {ray.cluster_resources()}, "
                            f"of which {ray.available_resources()} are free. Add nodes (`ray start --address=...`, "
                            "infra/GPU.md) or choose a looser distributed.placement_strategy (PACK); a resume may "
                            "change placement_strategy but not num_ranks (its optimizer state was saved by that many "
                            "ranks), a new run may also lower num_ranks, cpus_per_rank or gpus_per_rank")
        worker = ray.remote(RankWorker)
        self._actors = [
            worker.options(num_cpus=cfg.cpus_per_rank, num_gpus=cfg.gpus_per_rank, max_restarts=0,
                           scheduling_strategy=PlacementGroupSchedulingStrategy(
                               self._pg, placement_group_bundle_index=r)).remote(r, self.num_ranks, str(self._log(r)))
            for r in range(self.num_ranks)
        ]
        addresses = self._gather([a.address.remote() for a in self._actors], "start", timeout=cfg.startup_timeout_s)
        master_addr, master_port = addresses[0][0], addresses[0][1]
        self.rank_hosts = [ip for ip, _, _ in addresses]
        # All ranks on one machine: they meet in a file there and listen on loopback alone
        # (rendezvous.rendezvous_method); across machines, on rank 0's node IP.
        one_machine = len({node_id for _, _, node_id in addresses}) == 1
        shared = {RENDEZVOUS_ENV: f"ada-dist-{uuid.uuid4().hex}"} if one_machine else {}
        if one_machine:
            master_addr = "127.0.0.1"
        seen: dict[str, int] = {}
        envs = []
        for r, (_, _, node_id) in enumerate(addresses):
            local = seen.get(node_id, 0)
            seen[node_id] = local + 1
            envs.append({
                **shared, "RANK": str(r), "WORLD_SIZE": str(self.num_ranks), "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                # Ray pins a GPU rank to its own GPU through CUDA_VISIBLE_DEVICES, where it is device 0.
                "LOCAL_RANK": "0" if cfg.gpus_per_rank > 0 else str(local),
            })
        self.rank_pids = self._gather(
            [a.setup.remote(envs[r], model_dir, self.loss_cfg, self.optim_cfg, engine_kwargs, rollout_micro_batch_size,
                            self._reference_dir)
             for r, a in enumerate(self._actors)], "setup", timeout=cfg.startup_timeout_s)
        if self._started_ray:  # the agents and workers started since
            self._lifeline.watch(descendants(self._ray_pids))
        log.info("%d training ranks up in %.1fs on %s (rendezvous %s:%d, logs in %s)", self.num_ranks,
                 time.perf_counter() - started, ", ".join(f"rank {r}: {ip}" for r, ip in enumerate(self.rank_hosts)),
                 master_addr, master_port, self.log_dir)

    def close(self) -> None:
        """Stop the rank actors and the placement group, and the Ray this group started. Idempotent."""
        actors, self._actors = self._actors, []
        pg, self._pg = self._pg, None
        if actors or pg is not None or self._started_ray:
            import ray

            for actor in actors:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001 - an actor already dead is what we want
                    pass
            if pg is not None:
                try:
                    ray.util.remove_placement_group(pg)
                except Exception:  # noqa: BLE001
                    pass
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False
        shutil.rmtree(self._weights_dir, ignore_errors=True)
        self._lifeline.close()  # sweeps whatever of the local Ray outlived ray.shutdown

    def process_ids(self) -> dict[str, list[int]]:
        """The rank actors' pids, and the pids of the Ray processes this group started (empty when it joined)."""
        return {"ranks": list(self.rank_pids), "ray": list(self._ray_pids)}

    # --- the update-engine interface ---------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.num_ranks

    @property
    def optimizer_steps(self) -> int:
        return self._steps

    @property
    def module(self):
        """The driver's copy of the model with the ranks' current weights (pulled from rank 0 when stale)."""
        if self._pulled != self._version:
            path = self._weights_dir / "weights.pt"
            self._gather([self._actors[0].write_weights.remote(str(path))], "weight pull", ranks=[0])
            self._module.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            path.unlink()
            self._pulled = self._version
        return self._module

    def update(self, groups: list[Group]) -> dict[str, float]:
        """One training step over every rank; the same metrics as DeepSpeedUpdateEngine.update."""
        tis = self.loss_cfg.tis_cap is not None
        seqs = flatten(groups)
        if not seqs:
            lr = self._gather([self._actors[0].lr.remote()], "lr", ranks=[0])[0]
            return zero_metrics(lr=lr, tis=tis, world_size=self.num_ranks)
        by_group: dict[int, list[int]] = {}
        for i, s in enumerate(seqs):
            by_group.setdefault(s["group"], []).append(i)
        members = list(by_group.values())
        costs = [sum(len(seqs[i]["prompt"]) + len(seqs[i]["completion"]) for i in m) for m in members]
        shares = balance_by_tokens(members, costs, self.num_ranks)
        busy = [r for r in range(self.num_ranks) if shares[r]]
        # The plan draws the shuffle before any forward, as the one-rank engine does; it reads no log-prob.
        plan = plan_update(seqs, len(groups), self._shuffle, self.optim_cfg, self.loss_cfg,
                           world_size=self.num_ranks, max_response_len=self.max_response_len)
        current = old_is_current(plan)
        recompute_s = [0.0] * self.num_ranks
        if current:  # one optimizer step: its own forward gives the old log-probs; only the reference runs here
            if self._reference_dir is not None:
                answers = self._gather([self._actors[r].recompute_reference.remote([seqs[i] for i in shares[r]])
                                        for r in busy], "reference log-prob recompute", ranks=busy)
                for r, (values, seconds) in zip(busy, answers):
                    recompute_s[r] = seconds
                    for i, ref in zip(shares[r], values):
                        seqs[i]["ref"] = ref
        else:
            answers = self._gather([self._actors[r].recompute.remote([seqs[i] for i in shares[r]]) for r in busy],
                                   "old log-prob recompute", ranks=busy)
            for r, (values, seconds) in zip(busy, answers):
                recompute_s[r] = seconds
                for i, (old, ref) in zip(shares[r], values):
                    seqs[i]["old"], seqs[i]["ref"] = old, ref
        trained = self._gather([a.train_steps.remote(local_steps(seqs, plan, r), old_is_current=current)
                                for r, a in enumerate(self._actors)], "update")
        if current:
            for r, answer in enumerate(trained):
                for i, old in zip(plan[0].shares[r], answer[2]):
                    seqs[i]["old"] = old
        self._steps += len(plan)
        self._version += 1
        return update_metrics(seqs, [answer[0] for answer in trained],
                              [{"recompute_s": recompute_s[r], "optimize_s": trained[r][1]} for r in range(self.num_ranks)],
                              world_size=self.num_ranks, tis=tis, old_recomputed=not current)

    def save(self, directory: str | Path) -> Path:
        """Every rank's optimizer state (`rank_<r>/`), and the driver's shuffle RNG and step count."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._gather([a.save.remote(str(directory / f"rank_{r}")) for r, a in enumerate(self._actors)], "save")
        save_state({"world_size": self.num_ranks, "shuffle_rng": self._shuffle.get_state(),
                    "global_steps": self._steps, "zero_stage": self.optim_cfg.zero_stage,
                    "precision": self.optim_cfg.precision}, directory / STATE_FILE)
        return directory

    def load(self, directory: str | Path) -> None:
        path = Path(directory) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no update-engine state at {path}")
        state = load_state(path)
        check_world_size(path, state.get("world_size", 1), self.num_ranks)
        folders = [str(Path(directory) / f"rank_{r}") for r in range(self.num_ranks)]
        self._gather([a.load.remote(folders[r], folders) for r, a in enumerate(self._actors)], "load")
        self._shuffle.set_state(state["shuffle_rng"])
        self._steps = int(state["global_steps"])

    def rollout_engine(self, tokenizer=None, micro_batch_size: int | None = None):
        """A RolloutEngine whose rounds are split across the ranks (rank_rollout.py); each rank samples on
        its own copy with the tokenizer and micro-batch size it was set up with."""
        from ada_core.engines.rank_rollout import RankRolloutEngine

        return RankRolloutEngine(self)

    def generate_on(self, rank_runs: list[tuple[int, list, int]], sampling: SamplingParams) -> list:
        """Each (rank, requests, first index) run sampled on that rank, in parallel; answers in run order."""
        return self._gather([self._actors[r].generate.remote(requests, sampling, offset) for r, requests, offset in rank_runs],
                            "rollout", ranks=[r for r, _, _ in rank_runs])

    # --- plumbing --------------------------------------------------------------------------------

    def _log(self, rank: int) -> Path:
        return self.log_dir / f"rank_{rank}.log"

    def _tail(self, rank: int) -> str:
        path = self._log(rank)
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {path})"
        return f"last {min(_LOG_TAIL_LINES, len(lines))} lines of {path}:\n" + "\n".join(lines[-_LOG_TAIL_LINES:])

    def _gather(self, refs: list, what: str, ranks: Sequence[int] | None = None, timeout: float | None = None) -> list:
        """ray.get on one call per rank, in rank order. The first rank to fail is reported, not the
        ranks left waiting for it in a collective."""
        import ray

        ranks = list(range(len(refs))) if ranks is None else list(ranks)
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                late = [ranks[index[ref]] for ref in pending]
                logs = ", ".join(str(self._log(r)) for r in late)
                raise RankError(f"{what}: rank(s) {late} did not answer within {timeout:.0f}s; log: {logs}\n"
                                + "\n".join(self._tail(r) for r in late))
            for ref in ready:
                try:
                    results[index[ref]] = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                    # A rank whose peer died in a collective raises too, sometimes before the death is
                    # seen: a rank that died among the others is the cause, and is the one named.
                    failed = [(ranks[index[ref]], err)]
                    if not isinstance(err, ray.exceptions.RayActorError):  # a died rank is the cause already;
                        failed += self._failures(pending, index, ranks)  # a peer of a lost host may hang till gloo's timeout
                    died = [(rank, e) for rank, e in failed if isinstance(e, ray.exceptions.RayActorError)]
                    raise self._rank_error(what, *(died or failed)[0]) from None
        return results

    def _failures(self, refs: list, index: dict, ranks: list[int], wait_s: float = 10.0) -> list[tuple[int, Exception]]:
        """(rank, error) of the calls among `refs` that fail within `wait_s`."""
        import ray

        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s) if refs else ([], [])
        failed = []
        for ref in ready:
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                failed.append((ranks[index[ref]], err))
        return failed

    def _rank_error(self, what: str, rank: int, err: Exception) -> RankError:
        import ray

        where = f" on host {self.rank_hosts[rank]}" if rank < len(self.rank_hosts) else ""
        if isinstance(err, ray.exceptions.RayActorError):
            return RankError(f"{what}: training rank {rank}{where} died ({type(err).__name__}: {_first_line(err)}); "
                             f"log: {self._log(rank)}\n{self._tail(rank)}")
        cause = err.cause if getattr(err, "cause", None) is not None else err
        return RankError(f"{what}: training rank {rank}{where} raised {type(cause).__name__}: {_first_line(cause)}; "
                         f"log: {self._log(rank)}\n{cause}\n{self._tail(rank)}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def _shm_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())
