"""Session-wide fixtures shared by more than one tier.

The tiers, cheapest first (`make test-fast` runs the first alone; `make test` runs them all):
    fast/      no model, no server: the pure logic of every package, in well under a minute
    model/     the tiny model, DeepSpeed on CPU, in this process
    services/  real servers: vLLM (from .venv-vllm), Ray ranks, PostgreSQL, an MLflow server
    flows/     Prefect flows under Prefect's test harness
    stack/     tests that start Prefect servers of their own: `make ui`, fan-out (stack/conftest.py)
    cluster/   two hosts in network namespaces on a veth pair, a Ray cluster across them (root only;
               skips and says why elsewhere): training across hosts, a lost host (cluster/hosts.py)

- `ada_home` (autouse): a fresh ADA_HOME for the whole session, so tests never touch ./.ada and
  costly builds (the tiny model, SFT warm starts, curated sets) are made once and reused; under
  pytest-xdist the models and SFT warm starts are shared by the workers, made once for all.

Under pytest-xdist (`make test`) each module is one group, run whole on one worker, except that the
modules using one of SHARED_SERVERS form one group, so that server starts once; groups run slowest tier
first (TIER_ORDER), so no long module starts last while the other worker idles.
- `tiny_model`: the tiny model's HF folder, built once.
- `prefect_harness`: Prefect's test harness (a temporary server and database), started once.
- `postgres_uri`: a fresh database on the local PostgreSQL server, dropped at the end (`fresh_postgres_uri`:
  one per test).
- `free_port`: a free loopback port.
- `infra_ui`: infra/ui.py (what `make ui` runs) as a module.
- `vllm_server`: one real vLLM server (from `.venv-vllm`, `make vllm-env`) serving the tiny model;
  runs attach to it with `rollout.vllm.base_url` and load their own weights into it first.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

# Before anything imports prefect or mlflow: no telemetry from any test process or child.
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

POSTGRES_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"

# Session fixtures that start servers (30-60 s each here): under pytest-xdist, the modules that use one
# share a worker, so it starts once (a module that uses two goes with the first).
SHARED_SERVERS = ("vllm_server", "ui_stack")
TIER_ORDER = ("cluster", "stack", "services", "flows", "model", "fast")
TESTS = Path(__file__).resolve().parent


def module_groups() -> dict[str, str]:
    """Each test module (its path as in node ids, `tests/...`) -> the group of modules that run on one worker.

    A module is a group of its own unless a function in it (a test or a fixture) takes one of
    SHARED_SERVERS as an argument. Read from the source, because the controller, which hands groups
    out, does not collect; the workers order their items by the same table."""
    groups = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        module = str(path.relative_to(TESTS.parent))
        arguments = " ".join(re.findall(r"\bdef \w+\(([^)]*)\)", path.read_text()))
        groups[module] = next((name for name in SHARED_SERVERS if re.search(rf"\b{name}\b", arguments)), module)
    return groups


def pytest_xdist_make_scheduler(config, log):
    """`make test`'s scheduling: each group runs whole, in order, on one worker; groups in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    groups = module_groups()

    class ModuleGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return groups.get(module, module)

    return ModuleGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist: the slowest tier's groups first, so no long group starts last while the other
    worker idles (the controller hands groups out in this order: `--no-loadscope-reorder`)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    groups = module_groups()
    group_of = {item: groups.get(item.nodeid.split("::", 1)[0], item.nodeid.split("::", 1)[0]) for item in items}
    rank: dict[str, tuple[int, int]] = {}
    for index, item in enumerate(items):
        tier = item.nodeid.split("/")[1] if item.nodeid.count("/") >= 2 else ""
        here = (TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER), index)
        rank[group_of[item]] = min(rank.get(group_of[item], here), here)
    position = {item: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank[group_of[item]], position[item]))


@pytest.fixture(scope="session", autouse=True)
def ada_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("ada_home")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test`'s workers share the costly builds (named models, SFT warm starts: the tiny profile's
        # 600-step start is a minute here), each made once by whichever worker needs it first while the
        # other waits (ada_core.models.build.built_once); everything else in ADA_HOME stays the worker's.
        shared = tmp_path_factory.getbasetemp().parent / "shared-builds"  # the session's, above the workers'
        for part in ("models", "cache/sft"):
            (shared / part).mkdir(parents=True, exist_ok=True)
            (home / part).parent.mkdir(parents=True, exist_ok=True)
            (home / part).symlink_to(shared / part, target_is_directory=True)
    patch = pytest.MonkeyPatch()
    patch.setenv("ADA_HOME", str(home))
    # A developer's shell may point MLflow elsewhere; tests resolve to the session's own store.
    patch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield home
    patch.undo()


@pytest.fixture(autouse=True)
def sampler_registry_restored():
    """Every test leaves the sampler registry, the presets and the plugin modules as it found them: a test
    that registers a sampler in-process (an $ADA_SAMPLERS compare run in the worker) would otherwise list it
    in every later test the same xdist worker runs."""
    import sys

    from ada_core.config import PRESETS, registry

    from ada_core.config.presets import preset_names

    # the state to restore has the research samplers and installed entry points loaded and their presets added (as
    # any run has them after its first config): restoring a state from before their import would leave them
    # unregistered for good (their module stays imported), and a test iterating PRESETS would see it grow
    preset_names()
    samplers, loaded, presets, modules = dict(registry._SAMPLERS), set(registry._LOADED), dict(PRESETS), set(sys.modules)
    yield
    registry._SAMPLERS.clear()
    registry._SAMPLERS.update(samplers)
    registry._LOADED.clear()
    registry._LOADED.update(loaded)
    PRESETS.clear()
    PRESETS.update(presets)
    for name in set(sys.modules) - modules:
        if name.startswith("ada_sampler_plugin_"):
            del sys.modules[name]


@pytest.fixture(scope="session")
def tiny_model(ada_home):
    from ada_core.models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def prefect_harness(ada_home):
    """Flows run against a temporary Prefect server; task results persist under the session's ADA_HOME."""
    from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings({PREFECT_RESULTS_LOCAL_STORAGE_PATH: ada_home / "prefect" / "storage"}):
        with prefect_test_harness(server_startup_timeout=180):
            yield


@contextmanager
def postgres_database():
    """A fresh database on the local PostgreSQL server, dropped at the end; skipped when no server answers."""
    psycopg2 = pytest.importorskip("psycopg2")
    name = f"ada_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg2.connect(POSTGRES_ADMIN, connect_timeout=5)
    except psycopg2.OperationalError as err:
        pytest.skip(f"no PostgreSQL server at 127.0.0.1:5432: {err}")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.cursor() as cur:  # MLflow's pooled connections to it are ours; close them first
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


@pytest.fixture(scope="session")
def postgres_uri():
    """`postgresql://postgres@127.0.0.1:5432/<unique db>`, one for the session."""
    with postgres_database() as uri:
        yield uri


@pytest.fixture
def fresh_postgres_uri():
    """Like `postgres_uri`, but a database of the test's own, empty when it starts."""
    with postgres_database() as uri:
        yield uri


@pytest.fixture(scope="session")
def free_port():
    def pick() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    return pick


@pytest.fixture(scope="session")
def infra_ui():
    """`infra/ui.py` as a module (it is a script, not part of a package): what `make ui` runs."""
    spec = importlib.util.spec_from_file_location("ada_infra_ui", Path(__file__).resolve().parents[1] / "infra" / "ui.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory):
    """A vLLM server on the tiny model, started once (20-60 s on these CPUs) and stopped at the end."""
    from ada_core.engines.vllm_server import VLLMServer

    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    with VLLMServer(tiny_model, dtype="float32", log_path=log_path, startup_timeout_s=600) as server:
        patch = pytest.MonkeyPatch()  # runs attach with `rollout.vllm.base_url`; the key goes by the environment
        patch.setenv("ADA_VLLM_API_KEY", server.api_key)
        try:
            yield server
        finally:
            patch.undo()

