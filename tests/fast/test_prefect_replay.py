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
