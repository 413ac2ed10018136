"""Per-step overhead of the platform (Prefect task runs + MLflow logging) over the bare trainer loop.

Both arms run `ada_core.training.run_steps` on the same config and seed, so they do the same
training work; the platform arm passes `tasks.training.TASK_STEPS` (each step function a Prefect
task run) and the MLflow callbacks (per-step metrics, eval tables, checkpoint uploads, system
metrics), inside a Prefect flow run and an MLflow run on the embedded SQLite store. Arms alternate
(bare, platform, bare, ...) to spread machine noise over both.

    python benchmarks/platform_overhead.py --steps 20 --repeats 2 --preset grpo

Prefect runs in ephemeral mode; all state goes to a temporary ADA_HOME unless ADA_HOME is set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def configure(home: Path) -> None:
    (home / "prefect").mkdir(parents=True, exist_ok=True)
    os.environ.update({
        "ADA_HOME": str(home), "PREFECT_HOME": str(home / "prefect"), "TQDM_DISABLE": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--preset", default="grpo")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--prompts-per-step", type=int, default=32, help="B (the tiny profile's is 32)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for both arms (default: what the flows use, cores - 1)")
    args = parser.parse_args(argv)
    home = Path(os.environ.get("ADA_HOME") or tempfile.mkdtemp(prefix="ada-bench-"))
    configure(home)

    import torch
    from prefect import flow

    from ada_core.config import build_config
    from ada_core.training import run_steps, setup
    from flows import tracking
    from tasks.training import TASK_STEPS

    from flows.runtime import quiet_task_run_logs, torch_threads

    torch.set_num_threads(args.threads or torch_threads())
    config = build_config(args.preset, "tiny", overrides={
        "steps": args.steps, "eval_every": args.eval_every, "checkpoint_every": 0,
        "prompts_per_step": args.prompts_per_step,
    })

    def bare(run_dir: Path) -> float:
        state = setup(config, run_dir)
        try:
            start = time.perf_counter()
            run_steps(state)
            return (time.perf_counter() - start) / args.steps
        finally:
            state.close()

    @flow(name="overhead-benchmark")
    def platform(run_dir: str) -> float:
        quiet_task_run_logs()  # as the train flow does
        uri = tracking.default_tracking_uri()
        with tracking.tracked_run(uri, "overhead-benchmark", Path(run_dir).name) as (client, run_id):
            tracking.log_params(client, run_id, tracking.run_params(config, args.preset, "bench",
                                                                       facts=tracking.run_facts(curate=False)))
            state = setup(config, run_dir)
            run_logger = tracking.RunLogger(client, run_id)
            try:
                start = time.perf_counter()
                run_steps(state, TASK_STEPS, run_logger.callbacks())
                run_logger.flush()  # the queued metrics count against the platform
                return (time.perf_counter() - start) / args.steps
            finally:
                state.close()

    platform(str(home / "runs" / "warmup"))  # the ephemeral server, SFT cache and imports, outside the timing
    timings: dict[str, list[float]] = {"bare": [], "platform": []}
    for rep in range(args.repeats):
        timings["bare"].append(bare(home / "runs" / f"bare-{rep}"))
        timings["platform"].append(platform(str(home / "runs" / f"platform-{rep}")))
    bare_s = statistics.median(timings["bare"])
    platform_s = statistics.median(timings["platform"])
    print(f"\npreset {args.preset}, tiny profile ({config.prompts_per_step} prompts/step), {args.steps} steps, "
          f"eval every {args.eval_every}, {args.repeats} repeats per arm (median), torch threads {torch.get_num_threads()}")
    print("| arm | s/step (each repeat) | median s/step |")
    print("|---|---|---|")
    for arm, values in timings.items():
        print(f"| {arm} | {', '.join(f'{v:.3f}' for v in values)} | {statistics.median(values):.3f} |")
    print(f"\noverhead: {platform_s - bare_s:+.3f} s/step = {100 * (platform_s - bare_s) / bare_s:+.1f}%")


if __name__ == "__main__":
    main()
