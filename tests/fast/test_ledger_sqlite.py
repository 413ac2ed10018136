"""The prompt ledger on SQLite: one row per (step, prompt drawn), idempotent migrations, clear URL errors."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from support import simulated_run

from ada_core.config import ConfigError, build_config
from ada_core.run.ledger import Ledger, open_engine, read_rows


@pytest.mark.parametrize("method", ["ada-posterior", "ada-est", "ada-balance-m4", "dapo"])
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


def test_migration_is_idempotent_and_a_bad_url_is_clear(tmp_path):
    url = f"sqlite:///{tmp_path / 'x' / 'ledger.db'}"
    for _ in range(2):
        open_engine(url).dispose()
    with pytest.raises(RuntimeError, match="cannot open or migrate postgresql://nobody:\\*\\*\\*@127.0.0.1:1/x"):
        open_engine("postgresql://nobody:secret@127.0.0.1:1/x?connect_timeout=2")
    with pytest.raises(ConfigError, match="ledger.url holds a password"):
        build_config("grpo", "tiny", overrides={"ledger": {"url": "postgresql://u:pw@host/db"}})
