"""The prompt ledger: rows per step equal prompts drawn, the same rows on SQLite and PostgreSQL, a
killed and resumed run has each (step, prompt) once, `ada ledger` totals, the Alembic schema."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter

import numpy as np
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from ada_core.cli import app
from ada_core.config import ConfigError, build_config
from ada_core.run.ledger import VERSION_TABLE, Ledger, create_engine, open_engine, prompt_totals, read_rows
from ada_core.protocols import SamplingParams
from ada_core.data import PromptSource
from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, budgeted_methods, default_methods, make_prompts
from ada_core.training import Callbacks, run_steps, setup


def simulated_run(ledgers: list[Ledger], steps: int = 3, prompts: int = 24, method: str = "ada-est"):
    """Drive a sampler on the Bernoulli engine, recording every step in each ledger; returns the batches."""
    sampler = {**default_methods(), **budgeted_methods()}[method]
    source = PromptSource(make_prompts(48, np.random.default_rng(0)), seed=0)
    batches = []
    for step in range(1, steps + 1):
        batch = sampler.sample(source.take(prompts), BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14),
                               np.random.default_rng(step), source=source)
        for ledger in ledgers:
            ledger.record(step, batch.pools, {g.prompt.id for g in batch.groups})
        batches.append(batch)
    for ledger in ledgers:
        ledger.flush()
    return batches


@pytest.mark.parametrize("method", ["ada-est", "ada-balance-m4", "dapo"])
def test_rows_per_step_equal_prompts_drawn(tmp_path, method):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger.start(url, tmp_path, threshold=0.7)
    try:
        batches = simulated_run([ledger], method=method)
    finally:
        ledger.close()
    rows = read_rows(tmp_path)
    per_step = Counter(r["step"] for r in rows)
    for step, batch in enumerate(batches, start=1):
        assert per_step[step] == len({p.prompt.id for p in batch.pools})
        by_id = {r["prompt_id"]: r for r in rows if r["step"] == step}
        kept = {g.prompt.id for g in batch.groups}
        assert {pid for pid, r in by_id.items() if r["trained"]} == kept
        assert sum(r["samples"] for r in by_id.values()) == sum(len(p.samples) for p in batch.pools)
    assert json.loads((tmp_path / "ledger.json").read_text())["run_id"] == ledger.run_id


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


def test_migration_is_idempotent_and_a_bad_url_is_clear(tmp_path):
    url = f"sqlite:///{tmp_path / 'x' / 'ledger.db'}"
    for _ in range(2):
        open_engine(url).dispose()
    with pytest.raises(RuntimeError, match="cannot open or migrate postgresql://nobody:\\*\\*\\*@127.0.0.1:1/x"):
        open_engine("postgresql://nobody:secret@127.0.0.1:1/x?connect_timeout=2")
    with pytest.raises(ConfigError, match="ledger.url holds a password"):
        build_config("grpo", "tiny", overrides={"ledger": {"url": "postgresql://u:pw@host/db"}})


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

    state = setup(build_config("ada-est", "tiny", overrides={**overrides, "steps": 4}), run_dir)
    try:
        with pytest.raises(Killed):
            run_steps(state, callbacks=Callbacks(on_step=kill_at_3))
        saved_history = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["sampler"]
    finally:
        state.close()
    assert {r["step"] for r in read_rows(run_dir)} == {1, 2, 3}

    resumed = setup(build_config("ada-est", "tiny", overrides={**overrides, "steps": 4}), run_dir, resume=run_dir)
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
