"""Reliability drills that have a number: the checkpoint manifest's cost, the `\\boxed{` bomb before and
after, and the 50 MB prompt. The kill/resume and corruption drills are tests (tests/flows/test_resume_flows.py,
tests/model/test_reliability.py); docs/benchmarks/reliability.md tabulates all of them.

    ADA_HOME=/tmp/ada-bench OMP_NUM_THREADS=1 .venv/bin/python benchmarks/reliability.py --json out.json

Manifest cost: a real checkpoint of each model (weights, tokenizer, optimizer, RNG) is written by
`save_checkpoint` after one training step; then the manifest's two costs are timed on that folder:
hashing at save (`write_manifest`) and checking at resume (`verify_checkpoint`), best of `--repeats`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def manifest_cost(model: str, profile: str, repeats: int) -> dict:
    from ada_core.run.checkpoints import write_manifest, verify_checkpoint
    from ada_core.config import build_config
    from ada_core.training import run_steps, setup

    overrides = {"model": model, "sft_steps": 0, "steps": 1, "prompts_per_step": 2, "eval_every": 0,
                 "checkpoint_every": 0, "data": {"train_size": 16, "eval_size": 2}, "sampler": {"n": 2}}
    cfg = build_config("grpo", profile, overrides=overrides)
    with tempfile.TemporaryDirectory() as tmp:
        state = setup(cfg, Path(tmp) / "run")
        try:
            run_steps(state)  # saves the step-1 checkpoint, manifest included
            from ada_core.training import save_checkpoint

            save_s = _best(lambda: save_checkpoint(state), repeats)
        finally:
            state.close()
        folder = Path(tmp) / "run" / "checkpoints" / "step_000001"
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        write_s = _best(lambda: write_manifest(folder), repeats)
        verify_s = _best(lambda: verify_checkpoint(folder), repeats)
    return {"model": model, "checkpoint_mb": round(size / 2**20, 1), "save_checkpoint_s": round(save_s, 3),
            "manifest_write_s": round(write_s, 3), "manifest_verify_s": round(verify_s, 3),
            "manifest_share_of_save": round(write_s / save_s, 3)}


def _rescanning_last_boxed(text: str) -> str | None:
    """The extraction before issue 11: rescan from every `\\boxed{` (quadratic in unclosed boxes)."""
    for match in reversed(list(re.finditer(r"\\boxed\s*\{", text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def boxed_bomb(copies: list[int], old_max: int) -> list[dict]:
    from ada_core.records import Prompt
    from ada_core.rl.rewards import MathVerifier, last_boxed

    rows = []
    prompt = Prompt(id="q", text="?", answer="1")
    with MathVerifier(timeout_s=5.0, workers=1) as verifier:
        verifier.verify([(prompt, r"\boxed{1}")])  # start the worker outside the timing
        for n in copies:
            bomb = r"\boxed{" * n
            start = time.perf_counter()
            last_boxed(bomb)
            new_s = time.perf_counter() - start
            old_s = None
            if n <= old_max:
                start = time.perf_counter()
                _rescanning_last_boxed(bomb)
                old_s = time.perf_counter() - start
            start = time.perf_counter()
            [verdict] = verifier.verify([(prompt, bomb)])
            verify_s = time.perf_counter() - start
            rows.append({"copies": n, "kb": round(len(bomb) / 1000, 1),
                         "old_extract_s": None if old_s is None else round(old_s, 3), "new_extract_s": round(new_s, 4),
                         "verify_s": round(verify_s, 3), "status": verdict.status.value, "reward": verdict.reward})
    return rows


def huge_prompt(mb: int) -> dict:
    from ada_core.models import encode_prompts, load_tokenizer
    from ada_core.records import Prompt

    tokenizer = load_tokenizer("tiny")
    prompt = Prompt(id="huge", text="1+" * (mb * 2**19) + "1=", answer="1")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    kept = encode_prompts(tokenizer, [prompt], max_tokens=1024)
    seconds = time.perf_counter() - start
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"prompt_mb": mb, "kept": len(kept), "seconds": round(seconds, 4),
            "peak_rss_growth_mb": round((rss_after - rss_before) / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="Write the results here.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--old-max", type=int, default=8000, help="Largest bomb to time the old extraction on.")
    parser.add_argument("--skip-smollm2", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    results = {"load_before": os.getloadavg(), "cpus": os.cpu_count()}
    results["huge_prompt"] = huge_prompt(50)
    results["boxed_bomb"] = boxed_bomb([1000, 8000, 16000], args.old_max)
    results["manifest"] = [manifest_cost("tiny", "tiny", args.repeats)]
    if not args.skip_smollm2:
        results["manifest"].append(manifest_cost("smollm2-135m", "smollm2-135m", args.repeats))
    results["load_after"] = os.getloadavg()
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
