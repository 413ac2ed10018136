"""`prefect server start` for `make ui`, with the Run button's request made safe from SQLite's refusal.

Prefect's server on SQLite answers a write 503 ("Service Unavailable") when SQLite refuses it: a deferred
transaction that read before another connection wrote cannot take the write lock, and SQLite says
"database is locked" at once, without waiting (Prefect issues 10188 and 18934). Prefect's Python client
retries a 503; its UI does not: a deployment form's Run showed "Oops. Something went wrong" and created no
run, and the server logged nothing.

Two things keep `POST /api/deployments/<id>/create_flow_run` (the Run button's one request) from that:
- its transactions begin IMMEDIATE, as Prefect's own rule asks of a transaction that reads then writes
  (`with_for_update=True`; prefect/server/AGENTS.md): the write lock is taken at BEGIN, where SQLite waits for
  it (the busy timeout) rather than refusing. This is the fix: under load, with another caller writing all
  along, a deferred create was refused 8 times in a row (a browser test on a busy 2-core machine).
- `ReplayRefusedRuns` sends a create still refused through the app again, with a short backoff, before it
  answers. A replay cannot make a second run: the request is one transaction, rolled back when refused, and
  it is given an idempotency key when it has none (Prefect answers a second create with the same key with the
  first run).
Other writes are left as Prefect answers them: a 503 of Prefect's is not always "nothing written" (a delete can
commit before a later write of the same request is refused, so its replay answers 404), and Prefect's client
retries its own. A replay is logged in one line, and so is a 503 it gives up on.

Run as `python infra/prefect_server.py --host H --port P` with the server's environment; it serves what
`prefect server start` serves (the same app, its services and UI), in the foreground.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

RUN_PATH = re.compile(r"^/api/deployments/[0-9a-fA-F-]{36}/create_flow_run$")
REFUSED = 503
TRIES = 8  # waits of 0.05, 0.1, ..., 1 s: about 3.5 s before the 503 goes out
FIRST_WAIT_S = 0.05
MAX_WAIT_S = 1.0

Message = dict[str, Any]
log = logging.getLogger("prefect.server.replay")  # under prefect.server: the server's own log handler and level
RUN_REQUEST: ContextVar[bool] = ContextVar("ada_run_request", default=False)  # set while a Run is served


class ReplayRefusedRuns:
    """ASGI middleware: a deployment's create_flow_run answered 503 is replayed, with its body (and an idempotency
    key), up to `tries` times."""

    def __init__(self, app: Callable[..., Awaitable[None]], tries: int = TRIES, first_wait_s: float = FIRST_WAIT_S,
                 max_wait_s: float = MAX_WAIT_S):
        self.app, self.tries, self.first_wait_s, self.max_wait_s = app, tries, first_wait_s, max_wait_s

    async def __call__(self, scope: Message, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not RUN_PATH.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        body = _with_idempotency_key(body)
        scope = {**scope, "headers": [(name, value) for name, value in scope["headers"] if name != b"content-length"]
                 + [(b"content-length", str(len(body)).encode())]}
        token = RUN_REQUEST.set(True)  # seen by the tasks the app starts: the Run's transactions begin IMMEDIATE
        try:
            for attempt in range(self.tries):
                # a fresh scope each pass: routing writes into the one it is given (a mount's root_path, the route)
                answer, error = await self._once(dict(scope), body, receive)
                if _status(answer) != REFUSED or attempt == self.tries - 1:
                    break
                await asyncio.sleep(min(self.first_wait_s * 2 ** attempt, self.max_wait_s) * random.uniform(1, 1.5))
        finally:
            RUN_REQUEST.reset(token)
        status = _status(answer)
        if attempt:
            what = "answered" if status != REFUSED else "still refused, answered"
            log.warning("%s %s: refused (503) %d time(s), %s %d", scope["method"], scope["path"],
                        attempt + (status == REFUSED), what, status)
        for message in answer:
            await send(message)
        if error is not None:
            raise error  # as the app raised it after its answer (Starlette does, for the server to log it)

    async def _once(self, scope: Message, body: bytes,
                    receive: Callable[[], Awaitable[Message]]) -> tuple[list[Message], BaseException | None]:
        """One pass through the app with the buffered body: its response messages, held back, and what it
        raised after answering (Starlette's error middleware sends the handler's answer, then re-raises)."""
        given = False

        async def replay() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect, as the app would see it

        answer: list[Message] = []

        async def hold(message: Message) -> None:
            answer.append(message)

        try:
            await self.app(scope, replay, hold)
        except Exception as error:  # noqa: BLE001 - re-raised by the caller once the answer is sent
            if not answer:
                raise
            return answer, error
        return answer, None


def _with_idempotency_key(body: bytes) -> bytes:
    """The request's JSON with an idempotency key where it has none (a body that is not a JSON object: as it is,
    for Prefect to refuse)."""
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return body
    if not isinstance(request, dict) or request.get("idempotency_key"):
        return body
    return json.dumps({**request, "idempotency_key": f"ada-run-{uuid.uuid4()}"}).encode()


def _status(answer: list[Message]) -> int | None:
    return answer[0]["status"] if answer and answer[0]["type"] == "http.response.start" else None


def immediate_runs() -> bool:
    """Make the SQLite transactions of a Run request begin IMMEDIATE (`with_for_update=True`, which Prefect's
    create_flow_run does not pass); False, with one line logged, where this Prefect has no such hook (the
    replay alone is left)."""
    from prefect.server.database import configurations

    sqlite = getattr(configurations, "AioSqliteConfiguration", None)
    begin = getattr(sqlite, "begin_transaction", None)
    if begin is None or getattr(begin, "ada_immediate_runs", False):
        if begin is None:
            log.warning("this Prefect has no AioSqliteConfiguration.begin_transaction: a Run is only replayed")
        return begin is not None

    def begin_transaction(self, session, with_for_update: bool = False):
        return begin(self, session, with_for_update=with_for_update or RUN_REQUEST.get())

    begin_transaction.ada_immediate_runs = True
    sqlite.begin_transaction = begin_transaction
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)

    import uvicorn
    from prefect.logging.configuration import setup_logging
    from prefect.server.api.server import create_app
    from prefect.settings import (
        PREFECT_SERVER_API_KEEPALIVE_TIMEOUT,
        PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL,
        PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT,
        PREFECT_SERVER_LOGGING_LEVEL,
    )

    setup_logging()  # as the `prefect` command does first: the server's loggers and their level
    immediate_runs()
    print(f"Prefect server (infra/prefect_server.py) on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(ReplayRefusedRuns(create_app(final=True)), host=args.host, port=args.port,
                timeout_keep_alive=PREFECT_SERVER_API_KEEPALIVE_TIMEOUT.value(),
                ws_ping_interval=PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL.value(),
                ws_ping_timeout=PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT.value(),
                log_level=PREFECT_SERVER_LOGGING_LEVEL.value().lower())


if __name__ == "__main__":
    main()
