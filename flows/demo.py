"""`make demo`: GRPO against Ada-balance on the tiny model, fully embedded, in a few minutes on 2 CPUs.

    python -m flows.demo                      # one seed, the defaults below
    python -m flows.demo --seeds 0 1 --steps 30 --matched

Everything stays under $ADA_HOME (default ./.ada): mlflow.db and mlartifacts/ (MLflow), prefect/
(Prefect's home and its SQLite database; the demo runs Prefect in ephemeral mode, no server),
models/, cache/ (SFT warm starts), curated/ and runs/. `make ui` later serves the same stores, so
the demo's runs show up in both UIs; while `make ui` runs, the demo uses its servers instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

# The tiny profile (60 steps of 32 prompts, SFT warm start of 300 steps, eval every 10 steps)
# with a smaller curation: 1,088 prompts at k=4 keep ~250 the starting model solves 1-3 times in
# 4, of which 64 are held out. Sized for <= 10 minutes on 2 CPU cores (docs/BENCHMARKS.md).
DEMO_OVERRIDES = {
    "data.train_size": 1024,
    "data.eval_size": 64,
    "data.curation_k": 4,
}
DEMO_STEPS = None  # the profile's


def running_prefect_server(home: Path) -> str | None:
    """The API URL of the Prefect server `make ui` runs on this ADA_HOME, if it answers."""
    try:
        url = json.loads((home / "ui" / "servers.json").read_text())["prefect_url"]
        with urllib.request.urlopen(f"{url}/api/health", timeout=2) as response:
            return f"{url}/api" if response.status == 200 else None
    except (OSError, ValueError, KeyError):
        return None


def configure_environment() -> tuple[Path, str]:
    """State under $ADA_HOME, telemetry off, and Prefect's mode. Before importing prefect.

    Ephemeral (Prefect starts a temporary server on $ADA_HOME/prefect/prefect.db) unless `make ui`
    already serves that database: then the demo uses that server, so one process writes the file
    and the runs appear in the UI as they happen.
    """
    home = Path(os.environ.get("ADA_HOME") or Path.cwd() / ".ada").resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["ADA_HOME"] = str(home)
    (home / "prefect").mkdir(exist_ok=True)  # Prefect's SQLite file cannot be created in a missing folder
    os.environ["PREFECT_HOME"] = str(home / "prefect")
    api_url = running_prefect_server(home)
    if api_url:
        os.environ["PREFECT_API_URL"] = api_url
    else:
        os.environ.pop("PREFECT_API_URL", None)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ["DO_NOT_TRACK"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return home, api_url or "ephemeral"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="GRPO vs Ada-balance on the tiny model (embedded).")
    parser.add_argument("--steps", type=int, default=DEMO_STEPS, help="training steps per run (default: the tiny profile's 60)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds (default 0)")
    parser.add_argument("--variants", nargs="+", default=["grpo", "ada-balance"], help="presets to compare")
    parser.add_argument("--matched", action="store_true", help="add the matched-budget GRPO control")
    parser.add_argument("--tracking-uri", default=None, help="MLflow URI (default: $ADA_HOME/mlflow.db)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    home, prefect_mode = configure_environment()
    print(f"ADA_HOME={home}; Prefect: {prefect_mode}")
    from flows.compare import compare  # after the environment: Prefect reads its settings on import
    from flows.params import CompareParams

    params = CompareParams(
        variants=args.variants, seeds=args.seeds, matched_grpo=args.matched, steps=args.steps,
        overrides=DEMO_OVERRIDES, tracking_uri=args.tracking_uri,
    )
    start = time.perf_counter()
    summary = compare(params)
    minutes = (time.perf_counter() - start) / 60
    registered = summary["registered"]
    uri = summary["tracking_uri"]
    print(f"""
== Demo finished in {minutes:.1f} min ==
MLflow runs      : experiment '{params.experiment}' at {uri}
                   parent run {summary['parent_run_id']} with {len(summary['children'])} child runs
Registered model : {registered['uri'] + f" (version {registered['version']}, {registered['variant']})" if registered else 'none'}
Report           : {summary['report_dir']}/report.md (+ PNG plots; also on the parent run under report/)
Run directories  : {Path(summary['report_dir']).parent}
Open the UIs     : make ui        (Prefect http://127.0.0.1:4200, MLflow http://127.0.0.1:5000; same stores)
                   or only MLflow: {Path(sys.executable).parent / 'mlflow'} ui --backend-store-uri {uri}
Prefect home     : {home / 'prefect'}   Stop the UIs with: make ui-stop
""")
    return summary


if __name__ == "__main__":
    main()
