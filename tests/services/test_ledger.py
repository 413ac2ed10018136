"""The prompt ledger: rows per step equal prompts drawn, the same rows on SQLite and PostgreSQL, a
killed and resumed run has each (step, prompt) once, `ada ledger` totals, the Alembic schema."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter

import pytest
from support import simulated_run
import sqlalchemy as sa
from typer.testing import CliRunner

from ada_core.cli import app
from ada_core.config import build_config
from ada_core.run.ledger import VERSION_TABLE, Ledger, create_engine, prompt_totals, read_rows
from ada_core.training import Callbacks, run_steps, setup


def test_sqlite_and_postgres_write_the_same_rows(tmp_path, postgres_uri):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    lite = Ledger.start(f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path / "a", threshold=0.7)
    pg = Ledger.start(postgres_uri, tmp_path / "b", threshold=0.7)
    try:
        simulated_run([lite, pg], steps=3)
        assert lite.truncate_after(2) == pg.truncate_after(2) > 0
    finally:
        lite.close(), pg.close()
    lite_rows, pg_rows = read_rows(tmp_path / "a"), read_rows(tmp_path / "b", url=postgres_uri)
    assert lite_rows == pg_rows and {r["step"] for r in pg_rows} == {1, 2}
    with create_engine(postgres_uri).connect() as conn:  # Alembic's own table, apart from MLflow's
        assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == "0001"


class Killed(RuntimeError):
    pass


@pytest.mark.slow
def test_a_killed_and_resumed_run_has_each_step_and_prompt_once(tmp_path):
    overrides = {"prompts_per_step": 8, "eval_every": 0, "checkpoint_every": 2, "sft_steps": 0,
                 "data": {"train_size": 24, "eval_size": 8}, "ledger": {"url": f"sqlite:///{tmp_path / 'l.db'}"}}
    run_dir = tmp_path / "run"

    def kill_at_3(step, _metrics):
        if step == 3:  # step 3's rows are queued and written, but its checkpoint never happens
            raise Killed("killed after step 3")

    state = setup(build_config("ada-posterior", "tiny", overrides={**overrides, "steps": 4}), run_dir)
    try:
        with pytest.raises(Killed):
            run_steps(state, callbacks=Callbacks(on_step=kill_at_3))
        saved_history = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["sampler"]
    finally:
        state.close()
    assert {r["step"] for r in read_rows(run_dir)} == {1, 2, 3}

    resumed = setup(build_config("ada-posterior", "tiny", overrides={**overrides, "steps": 4}), run_dir, resume=run_dir)
    try:
        assert resumed.sampler.state_dict() == saved_history  # the posteriors continue from step 2
        assert {r["step"] for r in read_rows(run_dir)} == {1, 2}  # step 3's orphan rows are gone
        run_steps(resumed)
    finally:
        resumed.close()
    rows = read_rows(run_dir)
    keys = Counter((r["step"], r["prompt_id"]) for r in rows)
    assert max(keys.values()) == 1
    assert Counter(r["step"] for r in rows) == {1: 8, 2: 8, 3: 8, 4: 8}

    runner = CliRunner()
    out = runner.invoke(app, ["ledger", str(run_dir)])
    assert out.exit_code == 0, out.output
    totals = json.loads(out.output)
    assert totals == prompt_totals(rows) and sum(t["draws"] for t in totals) == 32
    out = runner.invoke(app, ["ledger", str(run_dir), "--csv"])
    table = list(csv.DictReader(io.StringIO(out.output)))
    assert len(table) == len(totals) and set(table[0]) >= {"prompt_id", "samples", "positives", "pass_rate"}
    missing = runner.invoke(app, ["ledger", str(tmp_path)])
    assert missing.exit_code == 2 and "ledger" in missing.output  # a usage error naming the missing file


FIRST_USE = """
import sys, time
from pathlib import Path
from alembic import command  # noqa: F401 - imported before the start line, so the processes meet there
from ada_core.run.ledger import Ledger
url, run_dir, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
(run_dir / "ready").touch()
while not go.exists():
    time.sleep(0.001)
Ledger.start(url, run_dir, threshold=0.7).close()
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_four_processes_opening_a_fresh_database_at_once_all_migrate_it(tmp_path, backend, request):
    """Four children on a fresh ADA_HOME start at the same instant; Alembic's `upgrade head` per
    process raced there (two CREATE TABLEs, one fails). Each must open the ledger, once migrated."""
    import os
    import subprocess
    import sys
    import time

    url = f"sqlite:///{tmp_path / 'fresh' / 'ledger.db'}" if backend == "sqlite" else request.getfixturevalue("fresh_postgres_uri")
    go = tmp_path / "go"  # created once every child has done its imports: they open the ledger at once
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    children = []
    for i in range(4):
        (tmp_path / f"run{i}").mkdir()
        children.append(subprocess.Popen([sys.executable, "-c", FIRST_USE, url, str(tmp_path / f"run{i}"), str(go)],
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"run{i}" / "ready").exists() for i in range(4)) and time.monotonic() < deadline:
        if any(child.poll() is not None for child in children):
            break
        time.sleep(0.05)
    go.touch()
    outputs = [(child.wait(timeout=120), child.stdout.read()) for child in children]
    assert [code for code, _ in outputs] == [0, 0, 0, 0], "\n".join(out[-1500:] for _, out in outputs)
    with create_engine(url).connect() as conn:
        assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == ["0001"]
        assert conn.execute(sa.text("SELECT count(*) FROM ledger_runs")).scalar() == 4
