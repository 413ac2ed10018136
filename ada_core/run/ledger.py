"""The prompt ledger: what happened to every prompt at every step, in SQL (SQLAlchemy 2.x).

One row per (run, step, prompt drawn): samples drawn, positives, sampler rounds, exit reason, and
whether its group was trained. It is the per-prompt history that metrics.jsonl averages away: which
prompts never resolve, how pass rates move as the policy learns, what a budgeted policy skipped.

- Where: SQLite at `$ADA_HOME/ledger.db` by default; any SQLAlchemy URL (PostgreSQL for teams)
  through `ledger.url` or `$ADA_LEDGER_URL`. Credentials belong in the environment
  (`$ADA_LEDGER_URL`, `PGPASSWORD`), never in the config: it is logged as run parameters.
- Schema: created and upgraded by Alembic (ada_core/run/ledger_migrations, version table
  `ada_ledger_alembic_version`) the first time a run opens the database, under a lock (`migrate`)
  so that runs starting at once on a fresh database take turns. A new migration is one
  more file in ledger_migrations/versions/ with `down_revision` set to the previous one.
- Writes: the trainer hands each step's pools to `Ledger.record` after the update (one queue put);
  a writer thread builds the rows and does one batched INSERT per step, so neither the sampler nor
  the loop waits on the database.
  `flush` (called before every checkpoint) waits until every submitted step is committed.
- Resume: the checkpoint carries the run id; resuming deletes that run's rows after the checkpoint
  step (a crash may have written some) and continues, so each (step, prompt) appears once. Resuming
  into another folder starts a new run id and copies the old run's rows up to the checkpoint.

`<run dir>/ledger.json` names the run id and the database (password hidden) for `ada ledger` and
the comparison report.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import os
import queue
import re
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from ada_core.paths import ada_home, exclusive_lock
from ada_core.records import PromptPool
from ada_core.run.files import LEDGER as LEDGER_FILE

VERSION_TABLE = "ada_ledger_alembic_version"
URL_ENV = "ADA_LEDGER_URL"

metadata = sa.MetaData()
runs_table = sa.Table(
    "ledger_runs", metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("run_dir", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
rows_table = sa.Table(
    "prompt_ledger", metadata,
    sa.Column("run_id", sa.String(64), sa.ForeignKey("ledger_runs.run_id", ondelete="CASCADE"), primary_key=True),
    sa.Column("step", sa.Integer, primary_key=True),
    sa.Column("prompt_id", sa.String(255), primary_key=True),
    sa.Column("samples", sa.Integer, nullable=False),
    sa.Column("positives", sa.Integer, nullable=False),
    sa.Column("rounds", sa.Integer, nullable=False),
    sa.Column("exit_reason", sa.String(32), nullable=False),
    sa.Column("trained", sa.Boolean, nullable=False),
)
COLUMNS = ["step", "prompt_id", "samples", "positives", "rounds", "exit_reason", "trained"]


def resolve_url(url: str | None = None) -> str:
    """`url`, else `$ADA_LEDGER_URL`, else SQLite at `$ADA_HOME/ledger.db`."""
    return url or os.environ.get(URL_ENV) or f"sqlite:///{ada_home() / 'ledger.db'}"


def shown_url(url: str) -> str:
    """The URL with any password hidden, for files and logs."""
    return make_url(url).render_as_string(hide_password=True)


def create_engine(url: str) -> Engine:
    """An SQLAlchemy engine; a bare `postgresql://` URL uses psycopg2 (what the project installs) when
    psycopg 3, SQLAlchemy 2.1's default driver, is not there."""
    parsed = make_url(url)
    if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None:
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return sa.create_engine(parsed)


# The key of the PostgreSQL advisory lock the migration holds (any constant shared by every process).
MIGRATION_LOCK_KEY = 0x6164615F6C656467  # "ada_ledg"


def migrate(engine: Engine) -> None:
    """Create or upgrade the schema to the newest Alembic revision (idempotent), one process at a time.

    Children of a group start at once on a fresh database: without a lock each saw no version table
    and ran the first revision's CREATE TABLEs, and all but one failed. On PostgreSQL the migration's
    transaction takes an advisory lock first (released at its commit), so the next process waits and
    then finds the schema at head; on SQLite an exclusive `flock` on `<database>.migrate.lock` does
    the same (SQLite's own locking does not cover Alembic's read-then-create).
    """
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("ledger_migrations")))
    with _sqlite_file_lock(engine.url), engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")


@contextlib.contextmanager
def _sqlite_file_lock(url):
    """An exclusive lock on `<database>.migrate.lock` while held, for a SQLite file; nothing otherwise."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        yield
        return
    with exclusive_lock(f"{url.database}.migrate.lock"):
        yield


def open_engine(url: str) -> Engine:
    """An engine on `url` with the schema migrated; SQLite's folder is created and foreign keys on."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    if parsed.get_backend_name() == "sqlite":
        sa.event.listen(engine, "connect", lambda conn, _: conn.execute("PRAGMA foreign_keys=ON"))
    try:
        migrate(engine)
    except sa.exc.SQLAlchemyError as err:
        engine.dispose()
        raise RuntimeError(f"prompt ledger: cannot open or migrate {shown_url(url)}: {err}") from err
    return engine


def pool_rows(pools: Iterable[PromptPool], trained_ids: set[str], threshold: float) -> list[dict[str, Any]]:
    """One row per prompt id (a prompt drawn twice in a step, as DAPO's extra batches can, is summed)."""
    rows: dict[str, dict[str, Any]] = {}
    for pool in pools:
        pid = pool.prompt.id
        row = rows.setdefault(pid, {"prompt_id": pid, "samples": 0, "positives": 0, "rounds": 0,
                                    "exit_reason": pool.exit_reason, "trained": pid in trained_ids})
        row["samples"] += len(pool.samples)
        row["positives"] += pool.num_positive(threshold)
        row["rounds"] = max(row["rounds"], pool.rounds)
        if pool.exit_reason != "uniform":  # DAPO: a varied draw names the prompt's outcome
            row["exit_reason"] = pool.exit_reason
    return list(rows.values())


class Ledger:
    """One run's ledger: a writer thread doing one batched INSERT per step."""

    def __init__(self, url: str, run_id: str, run_dir: Path, threshold: float):
        self.url, self.run_id, self.run_dir, self.threshold = url, run_id, Path(run_dir), threshold
        self.engine = open_engine(url)
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_loop, name="prompt-ledger", daemon=True)
        self._thread.start()

    # -- set-up -------------------------------------------------------------------------------------
    @classmethod
    def start(cls, url: str | None, run_dir: Path, threshold: float, resume_run_id: str | None = None,
              resume_step: int = 0, resume_same_dir: bool = True) -> "Ledger":
        """Open the ledger of the run in `run_dir`: a new run, or the resumed one continued at `resume_step`."""
        url = resolve_url(url)
        if resume_run_id is not None and resume_same_dir:
            ledger = cls(url, resume_run_id, run_dir, threshold)
            ledger._register()
            ledger.truncate_after(resume_step)
        else:
            ledger = cls(url, uuid.uuid4().hex, run_dir, threshold)
            ledger._register()
            if resume_run_id is not None:
                ledger._copy_from(resume_run_id, resume_step)
        (Path(run_dir) / LEDGER_FILE).write_text(json.dumps({"run_id": ledger.run_id, "url": shown_url(url)}) + "\n")
        return ledger

    def _register(self) -> None:
        with self.engine.begin() as conn:
            exists = conn.execute(sa.select(runs_table.c.run_id).where(runs_table.c.run_id == self.run_id)).first()
            if not exists:
                conn.execute(sa.insert(runs_table).values(
                    run_id=self.run_id, run_dir=str(self.run_dir.resolve()), created_at=dt.datetime.now(dt.timezone.utc)))

    def truncate_after(self, step: int) -> int:
        """Delete this run's rows after `step` (written after the checkpoint a resume starts from)."""
        with self.engine.begin() as conn:
            result = conn.execute(sa.delete(rows_table).where(rows_table.c.run_id == self.run_id, rows_table.c.step > step))
        return result.rowcount or 0

    def _copy_from(self, old_run_id: str, step: int) -> None:
        cols = [c for c in rows_table.c if c.name != "run_id"]
        select = sa.select(sa.literal(self.run_id).label("run_id"), *cols).where(
            rows_table.c.run_id == old_run_id, rows_table.c.step <= step)
        with self.engine.begin() as conn:
            conn.execute(sa.insert(rows_table).from_select(["run_id", *[c.name for c in cols]], select))

    # -- writing ------------------------------------------------------------------------------------
    def record(self, step: int, pools: Iterable[PromptPool], trained_ids: set[str]) -> None:
        """Queue one step's pools; the writer thread builds the rows and inserts them. Raises a writer error.

        The pools are only read, and nothing changes them after their step, so handing them over
        costs the loop one queue put."""
        self._raise_if_failed()
        self._queue.put((step, list(pools), trained_ids))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                step, pools, trained_ids = item
                rows = pool_rows(pools, trained_ids, self.threshold)
                for row in rows:
                    row["run_id"], row["step"] = self.run_id, step
                if self._error is None and rows:
                    with self.engine.begin() as conn:
                        conn.execute(sa.insert(rows_table), rows)  # one executemany: a batched INSERT
            except BaseException as err:  # surfaced to the trainer at the next record/flush
                self._error = err
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued step is committed; raise what the writer hit, if anything."""
        self._queue.join()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"prompt ledger: writing to {shown_url(self.url)} failed: {self._error}") from self._error

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.engine.dispose()

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}


# -- reading ----------------------------------------------------------------------------------------
class LedgerNotFound(FileNotFoundError):
    pass


def run_ledger(run_dir: str | Path, url: str | None = None) -> tuple[str, str]:
    """(url, run id) of the ledger of a run folder, from its ledger.json; `url` or `$ADA_LEDGER_URL` win."""
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        raise LedgerNotFound(f"{run_dir}: no {LEDGER_FILE}; was this run trained with the prompt ledger on?")
    try:
        info = json.loads(path.read_text())
        run_id, saved = str(info["run_id"]), str(info["url"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a ledger file ({err})") from None
    url = url or os.environ.get(URL_ENV) or saved
    if re.search(r":\*{3}@", url):
        raise ValueError(f"{path}: the ledger's URL {saved} needs its password: pass --url or set ${URL_ENV}")
    return url, run_id


def read_rows(run_dir: str | Path, url: str | None = None) -> list[dict[str, Any]]:
    """Every ledger row of the run in `run_dir`, ordered by (step, prompt)."""
    url, run_id = run_ledger(run_dir, url)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            result = conn.execute(sa.select(*[rows_table.c[c] for c in COLUMNS])
                                  .where(rows_table.c.run_id == run_id)
                                  .order_by(rows_table.c.step, rows_table.c.prompt_id))
            return [dict(r._mapping) for r in result]
    finally:
        engine.dispose()


def prompt_totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per prompt: steps drawn, samples, positives, pass rate, groups trained, times skipped, first and
    last step, and `resolved` (some draw had both a positive and a negative). Sorted by prompt id."""
    totals: dict[str, dict[str, Any]] = {}
    for r in rows:
        t = totals.setdefault(r["prompt_id"], {
            "prompt_id": r["prompt_id"], "draws": 0, "samples": 0, "positives": 0, "trained": 0, "skipped": 0,
            "first_step": r["step"], "last_step": r["step"], "resolved": False})
        t["draws"] += 1
        t["samples"] += r["samples"]
        t["positives"] += r["positives"]
        t["trained"] += int(bool(r["trained"]))
        t["skipped"] += int(r["samples"] == 0)
        t["first_step"], t["last_step"] = min(t["first_step"], r["step"]), max(t["last_step"], r["step"])
        t["resolved"] = t["resolved"] or 0 < r["positives"] < r["samples"]
    for t in totals.values():
        t["pass_rate"] = t["positives"] / t["samples"] if t["samples"] else None
    return [totals[k] for k in sorted(totals)]
