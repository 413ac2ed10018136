"""Training across two hosts (tests/cluster/hosts.py: network namespaces on a veth pair, one Ray cluster).

Every run is `ada train` started on host a (the driver's host, where the Ray head runs) with
`distributed.ray_address` set to the head, as infra/GPU.md tells a user; no interface is named by hand.
The 1-host run places both ranks on host a (STRICT_PACK), the 2-host run one on each (STRICT_SPREAD).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from ada_core.run.checkpoints import latest_checkpoint
from ada_core.run.files import read_metrics
from ada_core.run.ledger import read_rows

pytestmark = pytest.mark.slow

# A short 2-rank run (as tests/services/test_distributed.py's): the entropy bonus gives every step a gradient
# through both ranks, the KL term runs against the initial weights each rank loads.
SETTINGS = {"steps": 3, "prompts_per_step": 6, "eval_every": 0, "checkpoint_every": 1, "sft_steps": 0,
            "data.train_size": 64, "data.eval_size": 8, "optim.micro_batch_size": 8, "loss.entropy_coef": 0.01,
            "loss.kl_coef": 0.1, "distributed.num_ranks": 2, "distributed.startup_timeout_s": 600}
# Fifteen seconds from a lost host to the line naming it (the bound).
LOST_HOST_BOUND_S = 15.0


def train(hosts, out: Path, *extra: str, resume: bool = False) -> subprocess.Popen:
    """`ada train` on host a against the cluster; its output goes to <out>.log."""
    args = ["--resume", str(out)] if resume else [
        "--preset", "ada-balance", "--profile", "tiny", "--output-dir", str(out),
        *[f"--set={k}={v}" for k, v in SETTINGS.items()]]
    command = hosts.a.command([str(Path(os.sys.executable)), "-m", "ada_core.cli", "train", *args,
                               f"--set=distributed.ray_address={hosts.ray_address}", *extra])
    log = open(f"{out}.log", "ab")
    env = {**hosts.env, "ADA_HOME": os.environ["ADA_HOME"]}
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=hosts.env["PYTHONPATH"].split(os.pathsep)[0])


def finish(proc: subprocess.Popen, out: Path, timeout: float = 900) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"`ada train` did not finish within {timeout:.0f}s:\n{Path(f'{out}.log').read_text()[-4000:]}")
    text = Path(f"{out}.log").read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


def rank_hosts(run: Path) -> dict[int, tuple[str, str]]:
    """rank -> (its node IP, the interface its gloo sockets use), read from the ranks' logs."""
    found = {}
    for r in (0, 1):
        text = (run / "ranks" / f"rank_{r}.log").read_text()
        host = re.findall(r"rank \d+ of \d+ on (\S+):", text)
        interface = re.findall(r"through interface (\S+)", text)
        found[r] = (host[-1] if host else "", interface[-1] if interface else "lo")
    return found


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not (k.startswith(("time/", "throughput/", "dist/rank_")) or k.endswith("_s"))}
            for r in rows]


def assert_same_rows(got: list[dict], want: list[dict], tol: float = 1e-5) -> float:
    """Every row and key equal to `tol` (relative to the size, at least 1); the largest difference."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    worst = 0.0
    for a, b in zip(got, want):
        assert set(a) == set(b), set(a) ^ set(b)
        for key in a:
            x, y = a[key], b[key]
            if isinstance(x, float) and isinstance(y, float):
                if math.isnan(x) and math.isnan(y):
                    continue
                worst = max(worst, abs(x - y) / max(1.0, abs(y)))
                assert abs(x - y) <= tol * max(1.0, abs(y)), (a["step"], key, x, y)
            else:
                assert x == y, (a.get("step"), key, x, y)
    return worst


def ledger(run: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "run_id"} for row in read_rows(run)]


@pytest.fixture(scope="module")
def one_host_run(two_hosts, tmp_path_factory):
    out = tmp_path_factory.mktemp("one-host") / "run"
    finish(train(two_hosts, out, "--set=distributed.placement_strategy=STRICT_PACK"), out)
    return out


def test_a_run_across_two_hosts_equals_the_run_on_one(two_hosts, one_host_run, tmp_path):
    out = tmp_path / "run"
    finish(train(two_hosts, out, "--set=distributed.placement_strategy=STRICT_SPREAD"), out)
    # Rank 0 on the driver's host; each rank's gloo on the interface that reaches rank 0, found by itself.
    assert rank_hosts(out) == {0: (two_hosts.a.address, two_hosts.a.interface),
                               1: (two_hosts.b.address, two_hosts.b.interface)}
    assert {r: h for r, (h, _) in rank_hosts(one_host_run).items()} == {0: two_hosts.a.address, 1: two_hosts.a.address}
    rows, reference = read_metrics(out), read_metrics(one_host_run)
    assert [r["dist/world_size"] for r in rows if "dist/world_size" in r] == [2.0] * 3
    worst = assert_same_rows(without_timing(rows), without_timing(reference))
    assert ledger(out) == ledger(one_host_run) and ledger(out)
    print(f"2 hosts vs 1 host: {len(rows)} metric rows, largest relative difference {worst:.2e}; "
          f"{len(ledger(out))} ledger rows equal")


def run_until_lost(hosts, out: Path, lose) -> tuple[float, str]:
    """A run with one rank per host, `lose()` called just after its step-1 checkpoint; (seconds from then to
    its one `error:` line, that line)."""
    log = Path(f"{out}.log")
    proc = train(hosts, out, "--set=distributed.placement_strategy=STRICT_SPREAD")
    deadline = time.monotonic() + 600
    while out.is_dir() is False or latest_checkpoint(out) is None:
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, "no step-1 checkpoint within 600 s"
        time.sleep(0.2)
    lose()
    lost = time.monotonic()
    while "error:" not in log.read_text() and time.monotonic() < lost + 120:
        time.sleep(0.1)
    took = time.monotonic() - lost
    proc.wait(timeout=120)
    errors = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, log.read_text()[-4000:]
    assert f"training rank 1 on host {hosts.b.address} died" in errors[0], errors
    return took, errors[0]


def test_a_killed_host_ends_the_run_naming_it(two_hosts, tmp_path):
    """Every process of host b killed (SIGKILL, by pid) mid-step; host b's Ray worker is started again after."""
    took, error = run_until_lost(two_hosts, tmp_path / "run", two_hosts.b.kill)
    print(f"killed host named {took:.1f}s after its processes were killed: {error}")
    assert took < LOST_HOST_BOUND_S, (took, error)
    two_hosts.start_worker()


def test_a_lost_host_ends_the_run_naming_it_and_the_run_resumes_on_the_host_left(two_hosts, one_host_run, tmp_path):
    """Last in the module: host b's link is cut for good. The run (one rank per host) is cut mid-step just
    after its step-1 checkpoint; it ends with one line naming the host and rank within LOST_HOST_BOUND_S
    (the head's health check, hosts.HEALTH_CHECK), and `--resume` on host a alone, its placement changed
    to PACK, continues the same run folder to the same rows as the uninterrupted 1-host run."""
    out = tmp_path / "run"
    took, error = run_until_lost(two_hosts, out, two_hosts.b.cut)
    print(f"lost host named {took:.1f}s after its link was cut: {error}")
    assert took < LOST_HOST_BOUND_S, (took, error)

    finish(train(two_hosts, out, "--set=distributed.placement_strategy=PACK", resume=True), out)
    assert {r: h for r, (h, _) in rank_hosts(out).items()} == {0: two_hosts.a.address, 1: two_hosts.a.address}
    rows = read_metrics(out)
    worst = assert_same_rows(without_timing(rows), without_timing(read_metrics(one_host_run)))
    assert ledger(out) == ledger(one_host_run)
    print(f"resumed on host a: rows equal the 1-host run's to {worst:.2e}")
