"""Helpers more than one test tier uses (tests/ is on sys.path through its conftest.py)."""

from __future__ import annotations

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
    cache laid out as huggingface_hub expects (`<kind>s--org--name/snapshots/<commit>/...`, `refs/<ref>`);
    returns the commit, a sha1 of the contents like a git commit id."""
    import hashlib
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
    segments behind: a way the platform never stops a server.)"""
    import os
    import signal

    import psutil

    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait(timeout=30)


def locals_of(failure, function: str) -> dict:
    """The locals of `function`'s frame in the traceback of `failure` (a pytest.ExceptionInfo): what a
    constructor or factory that raised had made, to check it was released."""
    tb = failure.tb
    while tb is not None and tb.tb_frame.f_code.co_name != function:
        tb = tb.tb_next
    assert tb is not None, f"{function} is not in the traceback"
    return tb.tb_frame.f_locals
