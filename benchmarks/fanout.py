"""Wall time of one `compare` on `tiny`, children inline vs as runs of the `train` deployment on workers.

    python benchmarks/fanout.py                       # 4 children, 2 workers, 20 steps; JSON on stdout
    python benchmarks/fanout.py --workers 2 --steps 20 --repeats 1 --json docs/fanout.json

It starts the real `make ui` stack (infra/ui.py: Prefect server, MLflow server, $ADA_WORKERS workers
with `--limit 1`, the `ada-train` limit) on free ports under a temporary ADA_HOME, warms the caches
(tiny model, SFT warm start, curated set) with one untimed 1-step compare, then alternates the arms
(inline, deployments, ...). The compare is GRPO, Ada-pos, Ada-balance and the matched GRPO control:
4 children, the control starting when Ada-balance ends. Per child it reads from Prefect's API the
flow run's creation (submit), start (Running) and the start of its first `rollout-step-1` task run,
so the overhead of going through a deployment is submit -> first step, split into queue + pickup
(submit -> Running) and process start + setup (Running -> first step). `uptime` before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_ui():
    spec = importlib.util.spec_from_file_location("ada_infra_ui", REPO / "infra" / "ui.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def child_timings(summary: dict) -> list[dict]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    out = []
    with get_client(sync_client=True) as client:
        for child in summary["children"]:
            run = client.read_flow_run(child["flow_run_id"])
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
            first = min(t.start_time for t in tasks if t.name == "rollout-step-1")
            out.append({
                "child": f"{child['variant']}-s{child['seed']}",
                "submit_to_running_s": (run.start_time - run.created).total_seconds(),
                "running_to_first_step_s": (first - run.start_time).total_seconds(),
                "submit_to_first_step_s": (first - run.created).total_seconds(),
                "run_s": (run.end_time - run.start_time).total_seconds(),
            })
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of (inline, deployments)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)

    home = Path(tempfile.mkdtemp(prefix="ada-fanout-"))
    os.environ.update({
        "ADA_HOME": str(home), "PREFECT_HOME": str(home / "prefect"), "ADA_WORKERS": str(args.workers),
        "ADA_PREFECT_PORT": str(free_port()), "ADA_MLFLOW_PORT": str(free_port()), "TQDM_DISABLE": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    })
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    (home / "prefect").mkdir(parents=True)
    ui = load_ui()
    load_before = uptime()
    state = ui.start(home)
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: f"{state['prefect_url']}/api"}):
            from flows.compare import compare
            from flows.params import CompareParams

            def params(children: str, steps: int) -> CompareParams:
                return CompareParams(variants=["grpo", "ada-pos", "ada-balance"], matched_grpo=True, seeds=[0],
                                     steps=steps, children=children, experiment=f"fanout-bench-{children}")

            compare(params("inline", 1))  # warm-up: tiny model, SFT warm start, curated set, imports
            arms: dict[str, list[dict]] = {"inline": [], "deployments": []}
            for _ in range(args.repeats):
                for arm, rounds in arms.items():
                    start = time.perf_counter()
                    summary = compare(params(arm, args.steps))
                    wall = time.perf_counter() - start
                    if summary["failures"]:
                        raise RuntimeError(f"{arm}: children failed: {summary['failures']}")
                    rounds.append({"wall_s": wall, "children": child_timings(summary)})
                    print(f"{arm}: {wall:.1f} s", file=sys.stderr)
    finally:
        ui.stop(home)
    inline = statistics.median(r["wall_s"] for r in arms["inline"])
    fanned = statistics.median(r["wall_s"] for r in arms["deployments"])
    deployed = [c for r in arms["deployments"] for c in r["children"]]
    result = {
        "machine": {"cpus": os.cpu_count(), "uptime_before": load_before, "uptime_after": uptime()},
        "config": {"profile": "tiny", "children": 4, "workers": args.workers, "steps": args.steps,
                   "repeats": args.repeats, "worker_query_seconds": os.environ.get("PREFECT_WORKER_QUERY_SECONDS", "2 (make ui)")},
        "inline_wall_s": inline, "deployments_wall_s": fanned, "speedup": inline / fanned,
        "deployment_submit_to_first_step_s_median": statistics.median(c["submit_to_first_step_s"] for c in deployed),
        "inline_submit_to_first_step_s_median": statistics.median(
            c["submit_to_first_step_s"] for r in arms["inline"] for c in r["children"]),
        "arms": arms,
    }
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
