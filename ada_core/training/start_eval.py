"""The start's evaluation, computed once per ADA_HOME and read by every run that starts from the same model.

Every run of a comparison, a sweep or a paper grid evaluates at step 0 the model it starts from, on the same
held-out and validation prompts, with the same sampling seed (the data seed's), so they all compute the same
scores: one evaluation in six of a testbed run. A fresh run's step-0 evaluation on the embedded engine is
written to `$ADA_HOME/cache/start_eval/<key>.json` and a later run with the same key reads it instead of
sampling again. The key is everything the samples and their scores depend on:

- the start model folder's files (weights, config and tokenizer: `folder_fingerprint`);
- each prompt evaluated (held-out, validation, every suite benchmark): its id, token ids, answer and format;
- the sampling (temperature, top-p, max tokens, seed), `eval_k`, the positive threshold, the `rollout` and
  `verifier` sections, and the dtype and device the weights sample in (`optim.precision` bf16 casts them);
- the code that samples and scores (the engine's, the verifier's and this loop's source files), torch's and
  transformers' versions, the CPU model and torch's thread count (float kernels differ between machines).

Anything else (a resume, a run that starts from a checkpoint, a vLLM server or the rank group's engine,
whose samples depend on a server's or several processes' state, a verifier other than the platform's)
evaluates as before. A reused evaluation
writes the same metrics and generations as a computed one; only `time/eval_s` shows it. Delete the folder
to compute them again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import platform
from pathlib import Path
from typing import Any

import torch

from ada_core.paths import cache_dir, write_atomic

log = logging.getLogger(__name__)

FOLDER = "start_eval"


def start_eval_key(state: Any, sampling: Any) -> str | None:
    """The cache key of this run's step-0 evaluation, or None where it is not reused (see the module docstring)."""
    from ada_core.engines.transformers_engine import TransformersRolloutEngine
    from ada_core.models.build import folder_fingerprint
    from ada_core.rl.rewards import MathVerifier

    if state.step != 0 or state.start_model_dir is None or type(state.rollout) is not TransformersRolloutEngine \
            or type(state.verifier) is not MathVerifier:
        return None
    cfg = state.config
    sets = [("heldout", state.eval_prompts), ("val", state.val_prompts)]
    sets += [(f"suite:{bench.key}", prompts) for bench, prompts in state.suite]
    material = {
        "start": folder_fingerprint(Path(state.start_model_dir)),
        "prompts": {name: _prompts_sha(prompts) for name, prompts in sets},
        "sampling": [sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed],
        "eval_k": cfg.eval_k,
        "positive_threshold": cfg.sampler.positive_threshold,
        "rollout": cfg.rollout.model_dump(mode="json"),
        "verifier": cfg.verifier.model_dump(mode="json"),
        "engine": [state.rollout.micro_batch_size, state.rollout.share_prefixes],
        "weights": str(next(state.rollout.model.parameters()).dtype),  # optim.precision bf16 casts them
        "device": str(next(state.rollout.model.parameters()).device),
        "code": _sources_sha(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def read(key: str) -> dict | None:
    """The stored evaluation (`metrics`, `rows`) under `key`, or None (never stored, or unreadable)."""
    try:
        stored = json.loads((cache_dir() / FOLDER / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or not {"metrics", "rows"} <= stored.keys():
        return None
    log.info("step 0: the start's evaluation read from %s", cache_dir() / FOLDER / f"{key}.json")
    return stored


def write(key: str, metrics: dict[str, float], rows: list[dict]) -> None:
    """Store an evaluation under `key`, whole or not at all, so runs of one home that finish their step 0 together
    each write a complete file and a reader never sees half of one."""
    folder = cache_dir() / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / f"{key}.json", json.dumps({"metrics": metrics, "rows": rows}))


def _prompts_sha(prompts: list) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.id, list(p.prompt_ids or []), p.answer, (p.meta or {}).get("answer_format")]).encode())
    return h.hexdigest()


def _sources_sha() -> str:
    from ada_core.engines import transformers_engine
    from ada_core.rl import rewards

    h = hashlib.sha256()
    for source in (inspect.getsourcefile(transformers_engine), inspect.getsourcefile(rewards),
                   Path(__file__).with_name("loop.py")):
        h.update(Path(source).read_bytes())
    return h.hexdigest()


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
