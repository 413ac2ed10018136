"""Helpers more than one test tier uses (tests/ is on sys.path through its conftest.py)."""

from __future__ import annotations

import time

import numpy as np

from ada_core.config import build_config
from ada_core.data.source import PromptSource
from ada_core.protocols import SamplingParams
from ada_core.run.ledger import Ledger
from ada_core.sampling.simulate import (
    BernoulliEngine,
    BernoulliVerifier,
    budgeted_methods,
    default_methods,
    make_prompts,
)


def simulated_run(ledgers: list[Ledger], steps: int = 3, prompts: int = 24, method: str = "ada-posterior"):
    """Drive a sampler on the Bernoulli engine, recording every step in each ledger; returns the batches."""
    sampler = {**default_methods(), **budgeted_methods()}[method]
    source = PromptSource(make_prompts(48, np.random.default_rng(0)), seed=0)
    batches = []
    for step in range(1, steps + 1):
        batch = sampler.sample(source.take(prompts), BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14),
                               np.random.default_rng(step), source=source)
        for ledger in ledgers:
            ledger.record(step, batch.pools, {g.prompt.id for g in batch.groups})
        batches.append(batch)
    for ledger in ledgers:
        ledger.flush()
    return batches


# A short run on the tiny profile: small data, frequent evaluation and checkpoints.
SMALL = {
    "prompts_per_step": 8,
    "eval_every": 2,
    "checkpoint_every": 2,
    "data": {"train_size": 96, "eval_size": 16},
    "eval_k": 2,
}


def tiny_config(preset: str, steps: int, **extra):
    """`preset` on the tiny profile for `steps` steps, with SMALL and `extra` layered on."""
    return build_config(preset, "tiny", overrides={**SMALL, "steps": steps, **extra})


def put_in_hub_cache(cache, kind: str, repo: str, files: dict, ref: str = "main") -> str:
    """Write `files` (relative path -> bytes, text or a file to copy) as one snapshot of `repo` in a hub
    cache laid out as huggingface_hub's `snapshot_download` leaves it (`<kind>s--org--name/snapshots/<commit>/...`,
    `refs/<ref>`, and the commit's file list `trees/<commit>.json` with each file's size and git blob id);
    returns the commit, a sha1 of the contents like a git commit id."""
    import hashlib
    import json
    from pathlib import Path

    blobs = {}
    for rel, content in sorted(files.items()):
        if isinstance(content, Path):
            content = content.read_bytes()
        blobs[rel] = content.encode() if isinstance(content, str) else content
    commit = hashlib.sha1(b"".join(rel.encode() + b"\0" + data for rel, data in blobs.items())).hexdigest()
    folder = Path(cache) / f"{kind}s--{repo.replace('/', '--')}"
    for rel, data in blobs.items():
        target = folder / "snapshots" / commit / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    listing = {rel: {"size": len(data), "blob_id": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
               for rel, data in blobs.items()}
    (folder / "trees").mkdir(exist_ok=True)
    (folder / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": listing}, indent=1))
    return commit


def dataset_card(splits: dict[str, str]) -> str:
    """A dataset card whose YAML header maps each split to a data-file pattern (config `default`)."""
    lines = ["---", "configs:", "- config_name: default", "  data_files:"]
    for split, pattern in splits.items():
        lines += [f"  - split: {split}", f"    path: {pattern}"]
    return "\n".join(lines + ["---", "", "A test dataset.", ""])


def listeners_beyond_loopback(pid: int, ignore_ports: set[int] = frozenset()) -> list[tuple[str, int]]:
    """The (address, port) of each TCP socket process `pid` listens on outside 127.0.0.0/8 and ::1,
    ports in `ignore_ports` aside (`ss -ltnp`, through psutil)."""
    import ipaddress

    import psutil

    found = []
    for conn in psutil.Process(pid).net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port not in ignore_ports:
            if not ipaddress.ip_address(conn.laddr.ip).is_loopback:
                found.append((conn.laddr.ip, conn.laddr.port))
    return found


def write_run_folder(run_dir, label: str, seed: int, accuracy: list[float], samples_per_step: float,
                     num_params: int = 1000):
    """A run folder as a finished run leaves it (metrics.jsonl, run_info.json), with an eval at every step:
    step k has held-out accuracy `accuracy[k]` and generated `samples_per_step` samples (step 0: none)."""
    import json
    from pathlib import Path

    from ada_core import metrics as K

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, K.EVAL_AVG_AT_K: accuracy[0]}]
    for step in range(1, len(accuracy)):
        rows.append({"step": step, K.REWARD_MEAN: accuracy[step] / 2, K.BUDGET_GENERATED_SAMPLES: samples_per_step,
                     K.BUDGET_GENERATED_SAMPLES_CUM: samples_per_step * step})
        rows.append({"step": step, K.EVAL_AVG_AT_K: accuracy[step]})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "run_info.json").write_text(json.dumps({"label": label, "seed": seed, "num_params": num_params}))
    return run_dir


def kill_vllm_server(launcher) -> None:
    """SIGKILL a launched vLLM server (the launcher's children: the API server and its engine core), as an
    out-of-memory kill would, and wait for its launcher (`VLLMServer.process`) to end.

    The launcher is left alone, as it would be: it unlinks what the server had in /dev/shm and exits
    with the server's -9. (Killing the whole process group would take the launcher too, leaving the
    segments behind: a way the platform never stops a server.) It is not reaped here: `VLLMServer.stop`
    reaps it, once it has signalled the group for the last time."""
    import os
    import time

    import psutil

    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            child.kill()  # psutil checks the pid is still that child
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + 30
    while os.waitid(os.P_PID, launcher.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, f"the launcher (pid {launcher.pid}) did not end within 30 s of its server"
        time.sleep(0.05)


def locals_of(failure, function: str) -> dict:
    """The locals of `function`'s frame in the traceback of `failure` (a pytest.ExceptionInfo): what a
    constructor or factory that raised had made, to check it was released."""
    tb = failure.tb
    while tb is not None and tb.tb_frame.f_code.co_name != function:
        tb = tb.tb_next
    assert tb is not None, f"{function} is not in the traceback"
    return tb.tb_frame.f_locals



def own_weights_engine(module, tokenizer, micro_batch_size: int = 64, weight_version: int = 0, fail_load=None):
    """The in-process transformers engine on a copy of the policy of its own, so the trainer's updates reach
    it only through `sync_weights` / `stage_weights` + `load_staged`, as they reach a vLLM server: what
    `rollout.async_steps` needs, on the real tiny model, without a vLLM install. `fail_load(version)` may
    raise to fail that load (the weight-load boundary a server's reload crosses); the engine then keeps
    the weights it had, as a server whose reload failed does. `engine.loaded`: the versions loaded."""
    import copy
    import time
    from types import SimpleNamespace

    from ada_core import metrics as K
    from ada_core.engines.transformers_engine import TransformersRolloutEngine

    class OwnWeightsEngine(TransformersRolloutEngine):
        def sync_weights(self, module, version: int) -> dict[str, float]:
            return self.load_staged(self.stage_weights(module, version))

        def stage_weights(self, module, version: int):
            start = time.perf_counter()
            weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
            return SimpleNamespace(weights=weights, version=version, write_s=time.perf_counter() - start)

        def load_staged(self, staged) -> dict[str, float]:
            if fail_load is not None:
                fail_load(staged.version)
            self.model.load_state_dict(staged.weights)
            self.weight_version = staged.version
            self.loaded.append(staged.version)
            return {K.SYNC_WRITE_S: staged.write_s, K.SYNC_WEIGHT_VERSION: float(staged.version)}

    engine = OwnWeightsEngine(copy.deepcopy(module), tokenizer, micro_batch_size=micro_batch_size)
    engine.weight_version, engine.loaded = weight_version, []
    return engine


def with_own_weights_engine(monkeypatch, fail_load=None) -> list:
    """Make `setup` give every run an `own_weights_engine` (with `fail_load`) in place of the vLLM engine its
    config names (`rollout.vllm.base_url` is never contacted); returns the engines built, in order."""
    import ada_core.training.state as state

    built: list = []

    def build(config, model_dir, updater, tokenizer, output_dir, weight_version=0):
        built.append(own_weights_engine(updater.module, tokenizer, config.rollout.micro_batch_size,
                                        weight_version=weight_version, fail_load=fail_load))
        return built[-1]

    monkeypatch.setattr(state, "build_rollout_engine", build)
    return built


def wait_flow_run(client, run_id, timeout_s: float, poll_s: float = 3.0):
    """The flow run once its state is final (Completed, Failed, Crashed, Cancelled), polled through a Prefect
    `client`; None if it is not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flow_run = client.read_flow_run(run_id)
        if flow_run.state is not None and flow_run.state.is_final():
            return flow_run
        time.sleep(poll_s)
    return None
