"""Flows on fresh homes with Prefect's temporary API server: do they all start and finish?

Each flow is its own Python process that imports `flows` and calls `train(TrainParams(...))` (one
step of the tiny model, no curation, no SFT, nothing but the flows package's own defaults for
telemetry and the server's start-up bound: the variables are removed from the child's environment).
No PREFECT_API_URL, so each process starts Prefect's temporary server on its PREFECT_HOME.

    .venv/bin/python benchmarks/ephemeral_start.py --in-a-row 10 --at-once 4 [--startup-timeout 20]

`--in-a-row N`: N flows one after another, each on a new ADA_HOME (PREFECT_HOME under it).
`--at-once K`: K flows started together on one new ADA_HOME (one new Prefect database).
`--startup-timeout S` sets PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS for the children, to
compare with Prefect's own default (20) rather than the flows' (see flows/__init__.py).
`--trivial` runs a one-line flow instead of `train`: the same server start without the model.
`--ports P` narrows the children's port choice to P ports from `--port-base` (8000; Prefect picks among
8000-8999), so that servers started together collide as they do by chance (a port a recent run used is
in TIME_WAIT for a minute, and Prefect's check refuses it: give each run its own base). Each child then
says whether the server Prefect started for it was still its own at the end (`own_server`: "exited"
means its flow ran on another process's server, which took the port first).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLEARED = ("PREFECT_SERVER_ANALYTICS_ENABLED", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI")

TRAIN = """
import flows
from flows.params import TrainParams
from flows.train import train
result = train(TrainParams(preset="grpo", steps=1, prompts_per_step=2, curate=False, experiment="start",
                           overrides={"sft_steps": 0, "eval_every": 0, "checkpoint_every": 0, "data.train_size": 8,
                                      "data.eval_size": 2}))
print("finished", result["run_id"])
"""
PORTS = """
from prefect.server.api.server import SubprocessASGIServer
SubprocessASGIServer._port_range = range({base}, {base} + {ports})
"""
OWN_SERVER = """
from prefect.server.api.server import SubprocessASGIServer
_own = SubprocessASGIServer().server_process
print("own server", "alive" if _own is not None and _own.poll() is None else "exited")
"""
TRIVIAL = """
import flows
from flows.runtime import flow  # the platform's flows' decorator: the database is migrated first


@flow(name="start")
def start():
    return 1


print("finished", start())
"""


def child_env(home: Path, timeout: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED and k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update({"ADA_HOME": str(home), "PREFECT_HOME": str(home / "prefect"), "PYTHONPATH": str(REPO),
                "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
                # Nothing leaves the machine even where a run had telemetry on: an unreachable proxy.
                "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                "NO_PROXY": "127.0.0.1,localhost"})
    if timeout is not None:
        env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = str(timeout)
    return env


def start(code: str, home: Path, timeout: int | None) -> tuple[subprocess.Popen, float]:
    log = home / f"flow-{time.monotonic_ns()}.log"
    with open(log, "w") as fh:  # the child holds its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-c", code], env=child_env(home, timeout), cwd=REPO,
                                stdout=fh, stderr=subprocess.STDOUT, text=True)
    proc.log_path = str(log)  # type: ignore[attr-defined]
    return proc, time.perf_counter()


def outcome(proc: subprocess.Popen, started: float) -> dict:
    proc.wait()
    text = Path(proc.log_path).read_text()  # type: ignore[attr-defined]
    failure = next((line for line in text.splitlines() if "Timed out while attempting" in line
                    or line.startswith(("RuntimeError", "Traceback"))), "")
    own = next((line.split()[-1] for line in text.splitlines() if line.startswith("own server ")), None)
    return {"ok": proc.returncode == 0 and "finished" in text, "seconds": round(time.perf_counter() - started, 1),
            "locked_lines": text.count("database is locked"), "own_server": own, "failure": failure[:200]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--in-a-row", type=int, default=10)
    parser.add_argument("--at-once", type=int, default=4)
    parser.add_argument("--startup-timeout", type=int, default=None)
    parser.add_argument("--trivial", action="store_true")
    parser.add_argument("--ports", type=int, default=None)
    parser.add_argument("--port-base", type=int, default=8000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    narrowed = PORTS.format(base=args.port_base, ports=args.ports) if args.ports else ""
    code = narrowed + (TRIVIAL if args.trivial else TRAIN) + OWN_SERVER
    root = Path(tempfile.mkdtemp(prefix="ada-start-"))
    result: dict = {"flow": "trivial" if args.trivial else "train", "startup_timeout": args.startup_timeout,
                    "ports": args.ports, "port_base": args.port_base,
                    "in_a_row": [], "at_once": []}
    for i in range(args.in_a_row):
        home = root / f"row-{i}"
        home.mkdir()
        result["in_a_row"].append(outcome(*start(code, home, args.startup_timeout)))
        print("in a row", i, result["in_a_row"][-1], flush=True)
    if args.at_once:
        home = root / "together"
        home.mkdir()
        procs = [start(code, home, args.startup_timeout) for _ in range(args.at_once)]
        result["at_once"] = [outcome(*p) for p in procs]
        print("at once", result["at_once"], flush=True)
    for key in ("in_a_row", "at_once"):
        runs = result[key]
        if runs:
            print(f"{key}: {sum(r['ok'] for r in runs)}/{len(runs)} finished, "
                  f"{sum(r['own_server'] == 'alive' for r in runs)} on their own server; "
                  f"seconds {[r['seconds'] for r in runs]}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
