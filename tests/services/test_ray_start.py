"""A local Ray started for the ranks carries the driver's lifeline tag; the driver itself never does
(issue 26 finding 9): a subprocess the driver starts while `ray.init` runs must not inherit the tag, or the
lifeline's sweep kills it with the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os, subprocess, threading, time
from ada_core.config import DistributedConfig
from ada_core.engines.lifeline import TAG_ENV
from ada_core.engines.ray_cluster import start_ray

TAG = "tag-of-this-test"
seen, children, stop = [], [], threading.Event()

def watch():  # what another thread of the driver sees, and what a subprocess it starts inherits
    while not stop.is_set():
        if TAG_ENV in os.environ:
            seen.append(os.environ[TAG_ENV])
        out = subprocess.run(["env"], capture_output=True, text=True).stdout
        children.append(f"{TAG_ENV}={TAG}" in out)
        time.sleep(0.02)

thread = threading.Thread(target=watch)
thread.start()
try:
    started = start_ray(DistributedConfig(num_ranks=1, cpus_per_rank=1), env={TAG_ENV: TAG})
finally:
    stop.set()
    thread.join()

import ray
node = ray._private.worker._global_node
tagged = {}
for kind, infos in node.all_processes.items():
    for info in infos:
        try:
            with open(f"/proc/{info.process.pid}/environ", "rb") as f:
                tagged[kind] = f"{TAG_ENV}={TAG}".encode() in f.read().split(b"\0")
        except OSError:
            pass
worker = ray.get(ray.remote(num_cpus=0)(lambda: os.environ.get(TAG_ENV)).remote())
print(json.dumps({"started": started, "seen": seen, "children": len(children),
                  "children_tagged": sum(children), "after": os.environ.get(TAG_ENV), "tagged": tagged,
                  "worker": worker}))
ray.shutdown()
"""


def test_start_ray_gives_the_tag_to_rays_processes_and_never_to_the_driver(tmp_path):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    env.pop("ADA_LIFELINE", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                         cwd=os.getcwd())
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["started"] is True
    assert report["seen"] == [] and report["after"] is None  # the driver's environment never held it
    assert report["children"] > 0 and report["children_tagged"] == 0  # nor did what it started meanwhile
    # Ray's own processes have it, and so does a worker the raylet starts later
    assert report["tagged"].get("raylet") and report["tagged"].get("gcs_server"), report["tagged"]
    assert report["worker"] == "tag-of-this-test"
