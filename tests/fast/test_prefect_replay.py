"""infra/prefect_server.py's ReplayRefusedRuns: a deployment's create_flow_run that Prefect answered 503 (SQLite
refused it, nothing written) goes through the app again, with its body and an idempotency key, before anyone sees
the 503; every other request is answered as the app answers it.

The app here is Starlette's, with Prefect's way of answering: an exception handler that answers 503 for a
refused write and 500 otherwise, which Starlette's error middleware sends and then re-raises."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

spec = importlib.util.spec_from_file_location("ada_prefect_server", Path(__file__).resolve().parents[2] / "infra" / "prefect_server.py")
prefect_server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prefect_server)


class Refused(Exception):
    """Stands for sqlite3's "database is locked", which Prefect answers 503."""


class Broken(Exception):
    pass


RUN = "/api/deployments/0c432d20-afe7-42a5-8b98-07dcc1131ccc/create_flow_run"


def _app(refusals: int, seen: list, broken: bool = False, path: str = RUN) -> Starlette:
    async def create(request: Request) -> JSONResponse:
        body = await request.body()
        assert int(request.headers.get("content-length", 0)) == len(body)
        seen.append((request.method, json.loads(body) if body else None))
        if broken:
            raise Broken("not a refusal")
        if len(seen) <= refusals:
            raise Refused("database is locked")
        return JSONResponse({"created": len(seen)}, status_code=201)

    async def handler(request: Request, exc: Exception) -> JSONResponse:  # Prefect's custom_internal_exception_handler
        if isinstance(exc, Refused):
            return JSONResponse({"exception_message": "Service Unavailable"}, status_code=503)
        return JSONResponse({"exception_message": "Internal Server Error"}, status_code=500)

    api = Starlette(routes=[Route(path.removeprefix("/api"), create, methods=["POST", "GET", "DELETE"])],
                    exception_handlers={Exception: handler})
    return Starlette(routes=[Mount("/api", app=api)])  # as Prefect's: the API mounted under /api


def _call(app, method: str = "POST", path: str = RUN, tries: int = 4, body: bytes = b'{"name": "run"}') -> httpx.Response:
    wrapped = prefect_server.ReplayRefusedRuns(app, tries=tries, first_wait_s=0.001, max_wait_s=0.002)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=wrapped, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, content=body if method == "POST" else None)

    return asyncio.run(go())


def test_a_refused_run_is_created_again_with_its_body_and_one_idempotency_key(caplog):
    seen: list = []
    with caplog.at_level(logging.WARNING, logger="prefect.server.replay"):
        response = _call(_app(refusals=2, seen=seen))
    assert response.status_code == 201 and response.json() == {"created": 3}
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2]  # the same request each time, key included
    method, body = seen[0]
    assert method == "POST" and body["name"] == "run" and body["idempotency_key"].startswith("ada-run-")
    assert f"POST {RUN}: refused (503) 2 time(s), answered 201" in caplog.text


def test_a_run_with_its_own_idempotency_key_keeps_it():
    seen: list = []
    assert _call(_app(refusals=1, seen=seen), body=b'{"idempotency_key": "mine"}').status_code == 201
    assert [body for _, body in seen] == [{"idempotency_key": "mine"}] * 2


def test_a_run_still_refused_after_every_try_is_answered_503_and_logged(caplog):
    seen: list = []
    with caplog.at_level(logging.WARNING, logger="prefect.server.replay"):
        response = _call(_app(refusals=10, seen=seen), tries=3)
    assert response.status_code == 503 and len(seen) == 3
    assert "refused (503) 3 time(s), still refused, answered 503" in caplog.text


@pytest.mark.parametrize("method, path, refusals, broken, status, passes", [
    ("GET", RUN, 1, False, 503, 1),                               # only the POST that creates a run
    ("POST", RUN, 0, True, 500, 1),                               # an error that is not a refusal: as it was
    ("POST", RUN, 0, False, 201, 1),                              # a run created at once: answered once
    ("POST", "/api/flow_runs/", 1, False, 503, 1),               # another write: Prefect's answer, untouched
    ("DELETE", "/api/variables/name/busy", 1, False, 503, 1),    # (a 503 there may follow a commit)
])
def test_only_refused_runs_are_replayed(method, path, refusals, broken, status, passes):
    seen: list = []
    response = _call(_app(refusals=refusals, seen=seen, broken=broken, path=path), method=method, path=path)
    assert response.status_code == status
    assert len(seen) == passes


def test_a_run_request_takes_the_write_lock_at_begin_where_another_request_is_refused(tmp_path):
    """The fix itself, on Prefect's own SQLite configuration (its pragmas and BEGIN handling, a real WAL file): a
    transaction that reads, sees another connection commit, then writes. On any other path Prefect begins it
    DEFERRED and SQLite refuses the write at once ("database is locked", Prefect's 503); on the Run path it begins
    IMMEDIATE, so the other connection's write waits for it and both rows land."""
    import sqlite3
    import threading

    import sqlalchemy as sa
    from prefect.server.database.configurations import AioSqliteConfiguration

    assert prefect_server.immediate_runs() and prefect_server.immediate_runs()  # a second call patches nothing
    db = tmp_path / "prefect.db"
    with sqlite3.connect(db) as setup:
        setup.execute("PRAGMA journal_mode = WAL")
        setup.execute("CREATE TABLE runs (name TEXT)")
    config = AioSqliteConfiguration(connection_url=f"sqlite+aiosqlite:///{db}", timeout=5)

    def other_writer(name: str, settled: threading.Event) -> threading.Thread:
        """Commits a row at once, or, where the write lock is held, says so and waits for it."""
        def write():
            try:
                with sqlite3.connect(db, timeout=0) as other:
                    other.execute("INSERT INTO runs VALUES (?)", (name,))
                settled.set()
            except sqlite3.OperationalError:  # locked: the request holds the write lock since its BEGIN
                settled.set()
                with sqlite3.connect(db, timeout=30) as other:
                    other.execute("INSERT INTO runs VALUES (?)", (name,))

        return threading.Thread(target=write)

    async def create(request: Request) -> JSONResponse:
        path = request.url.path
        session = await config.session(await config.engine())
        settled = threading.Event()
        other = other_writer(f"other {path}", settled)
        try:
            async with config.begin_transaction(session):
                await session.execute(sa.text("SELECT count(*) FROM runs"))
                other.start()
                await asyncio.to_thread(settled.wait, 30)  # committed (DEFERRED) or waiting for this one (IMMEDIATE)
                await session.execute(sa.text("INSERT INTO runs VALUES (:name)"), {"name": path})
        except sa.exc.OperationalError as error:
            return JSONResponse({"refused": str(error.orig)}, status_code=503)
        finally:
            await session.close()
        await asyncio.to_thread(other.join)
        return JSONResponse({"created": path}, status_code=201)

    other_path = RUN.replace("create_flow_run", "schedule")
    app = Starlette(routes=[Route(RUN, create, methods=["POST"]), Route(other_path, create, methods=["POST"])])
    refused = _call(app, path=other_path, tries=1)
    created = _call(app, path=RUN, tries=1)
    assert refused.status_code == 503 and "database is locked" in refused.json()["refused"]
    assert created.status_code == 201, created.text
    with sqlite3.connect(db) as check:
        names = sorted(name for (name,) in check.execute("SELECT name FROM runs"))
    assert names == sorted([f"other {other_path}", f"other {RUN}", RUN])
