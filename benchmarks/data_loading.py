"""Loader and curation (dedup) time before and after Hugging Face `datasets`, cold and cached.

    .venv/bin/python benchmarks/data_loading.py --rows 100000 --json /tmp/data_loading.json

Writes a synthetic parquet in the OpenR1-Math schema (problem, solution, answer, problem_type,
question_type, source, uuid; 1% repeated problems), then times, side by side in one process:

- before: the pyarrow + Python loader as it was before `datasets` (ada_core/data/prompts.py at
  BEFORE_COMMIT, loaded from git) and the plain-Python dedup loop;
- after, cold: `load_dataset_file` and `curation.dedup` with an empty ADA_HOME (so an empty
  datasets cache: the parquet is converted to Arrow and every check/normalisation runs);
- after, cached: the same calls again (the Arrow file and the `map` results come from the cache).

Each figure is the best of `--repeats` runs (cold runs each get a fresh ADA_HOME).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BEFORE_COMMIT = "2125afa"  # main before issue 14: pyarrow to_pylist + the same row checks


def write_openr1(path: Path, rows: int, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    problems = []
    for i in range(rows):
        if i and rng.random() < 0.01:
            problems.append(problems[rng.randrange(len(problems))])  # a repeated problem
            continue
        a, b = rng.randint(1, 10**6), rng.randint(1, 10**6)
        problems.append(f"Let $x = {a}$ and $y = {b}$. Find the remainder when $x \\cdot y + {i}$ is divided by 7.")
    table = pa.table({
        "problem": problems,
        "solution": [f"We compute step by step. ... so the answer is $\\boxed{{{i % 7}}}$." for i in range(rows)],
        "answer": [str(i % 7) for i in range(rows)],
        "problem_type": ["Number Theory"] * rows,
        "question_type": ["math-word-problem"] * rows,
        "source": ["synthetic"] * rows,
        "uuid": [f"{i:08x}-bench" for i in range(rows)],
    })
    pq.write_table(table, path)


def old_data_module():
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE_COMMIT}:ada_core/data/prompts.py"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "data_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("data_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["data_before"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def old_dedup(prompts):
    from ada_core.data.curation import normalise_text

    first, kept = {}, []
    for p in prompts:
        key = normalise_text(p.text)
        if key not in first:
            first[key] = p.id
            kept.append(p)
    return kept


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ada-data-bench-"))
    data = work / "openr1_bench.parquet"
    write_openr1(data, args.rows)
    before = old_data_module()
    from ada_core.data import curation, data as after

    results: dict[str, float] = {}
    kept: dict[str, int] = {}
    for _ in range(args.repeats):
        t, prompts_before = timed(lambda: before.load_dataset_file(data))
        results["load_before_s"] = min(results.get("load_before_s", 1e9), t)
        t, kept_before = timed(lambda: old_dedup(prompts_before))
        results["dedup_before_s"] = min(results.get("dedup_before_s", 1e9), t)

        os.environ["ADA_HOME"] = tempfile.mkdtemp(prefix="home-", dir=work)  # an empty datasets cache
        t, prompts_after = timed(lambda: after.load_dataset_file(data))
        results["load_after_cold_s"] = min(results.get("load_after_cold_s", 1e9), t)
        t, _ = timed(lambda: curation.dedup(prompts_after))
        results["dedup_after_cold_s"] = min(results.get("dedup_after_cold_s", 1e9), t)
        t, again = timed(lambda: after.load_dataset_file(data))
        results["load_after_cached_s"] = min(results.get("load_after_cached_s", 1e9), t)
        t, (kept_after, _) = timed(lambda: curation.dedup(prompts_after))
        results["dedup_after_cached_s"] = min(results.get("dedup_after_cached_s", 1e9), t)
        assert prompts_before == prompts_after == again, "the two loaders disagree"
        assert [p.id for p in kept_before] == [p.id for p in kept_after], "the two dedups disagree"
        kept = {"rows": len(prompts_after), "after_dedup": len(kept_after)}

    report = {
        "rows": args.rows, **kept, "repeats": args.repeats, **{k: round(v, 3) for k, v in results.items()},
        "load_cached_speedup": round(results["load_before_s"] / results["load_after_cached_s"], 2),
        "load_cold_ratio": round(results["load_after_cold_s"] / results["load_before_s"], 2),
        "dedup_cached_speedup": round(results["dedup_before_s"] / results["dedup_after_cached_s"], 2),
        "dedup_cold_ratio": round(results["dedup_after_cold_s"] / results["dedup_before_s"], 2),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
