"""A fake OpenAI-compatible vLLM server for the fast tier: the streaming client, the weight-sync calls and the
partial-rollout freeze / thaw run against it in milliseconds, on 127.0.0.1 only.

It speaks HTTP/1.1 over asyncio (keep-alive, chunked server-sent events), in a thread of its own. Every
completion is the same script of bytes, one token per byte (a UTF-8 text, so a multi-byte character spans
tokens as it does with a real tokenizer), then EOS (token 256). Prompt ids are >= 300, so a request whose
prompt ends in script bytes is a resumed sample: it goes on from that position. A token's log-prob names
the weight version that sampled it (`logprob_of`). Knobs, each settable from the test's thread:

    stall_at      a request starting before this script position streams up to it, then waits (until
                  `release()` or its client leaves); a request starting at or after it does not stall
    stall_prompts first prompt ids that stall (None: every prompt)
    hold_open     requests wait before their response headers until `release()`
    hold_paths    paths (a weight sync's `/pause`) whose requests wait until `release()`
    fail_paths    path -> status code answered instead (`/pause`: 500, a weight sync's pause failed)
    fail_prompts  first prompt ids whose completions are answered 500

It records the request bodies (`requests`), the streams open now and at most (`open_streams`,
`peak_streams`) and the weight version (`/update_weight_version`).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import threading
import time
from collections.abc import Callable

EOS = 256
SCRIPT = "héllo wörld ✓ done".encode()


def decode(ids: list[int]) -> str:
    """The fake tokenizer's text of completion ids (special tokens, EOS, left out)."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def logprob_of(version: int) -> float:
    return -0.001 * (1 + version)


class FakeOpenAI:
    def __init__(self, script: bytes = SCRIPT):
        self.script = list(script)
        self.version = 0
        self.stall_at: int | None = None
        self.stall_prompts: set[int] | None = None
        self.hold_open = False
        self.hold_paths: set[str] = set()
        self.fail_paths: dict[str, int] = {}
        self.fail_prompts: set[int] = set()
        self.requests: list[dict] = []
        self.rpcs: list[str] = []
        self.open_streams = self.peak_streams = 0
        self._changed = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-openai", daemon=True)
        self._thread.start()
        self._release = asyncio.run_coroutine_threadsafe(self._make_event(), self._loop).result()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result()
        self.base_url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _make_event(self) -> asyncio.Event:
        return asyncio.Event()

    # --- the test's side ----------------------------------------------------------------------------
    def stall(self, at: int) -> None:
        """From now on, requests that start before script position `at` wait there until `release()`."""
        self._release = asyncio.run_coroutine_threadsafe(self._make_event(), self._loop).result()
        self.stall_at = at

    def hold(self, *, headers: bool = False, paths: tuple[str, ...] = ()) -> None:
        """From now on, completions wait before their headers (`headers`), and requests to `paths` wait,
        until `release()`."""
        self._release = asyncio.run_coroutine_threadsafe(self._make_event(), self._loop).result()
        self.hold_open, self.hold_paths = headers, set(paths)

    def release(self) -> None:
        """Let every stalled or held request go on (and the later ones: stall_at and hold_open are cleared)."""
        self.stall_at, self.hold_open = None, False
        self.hold_paths = set()
        self._loop.call_soon_threadsafe(self._release.set)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
        """Block until `condition()` holds (checked at each change the server makes, and every 50 ms)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the fake server never saw {what}")
                self._changed.wait(min(left, 0.05))

    def completions(self) -> list[dict]:
        return [r for r in self.requests if "prompt" in r]

    def close(self) -> None:
        async def stop():
            self._server.close()
            self._release.set()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _note(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # --- HTTP ----------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, target = head.split(b" ", 2)[:2]
                headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
                length = int(headers.get(b"content-length", headers.get(b"Content-Length", b"0")))
                body = json.loads(await reader.readexactly(length)) if length else {}
                path = target.decode().split("?", 1)[0]
                if not await self._answer(method.decode(), path, body, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _reply(self, writer: asyncio.StreamWriter, status: int, payload) -> None:
        data = json.dumps(payload).encode()
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (status, len(data)) + data)
        await writer.drain()

    async def _answer(self, method: str, path: str, body: dict, reader, writer) -> bool:
        """Answer one request; False when the connection is to be closed."""
        while path in self.hold_paths:
            await self._release.wait()
        if path in self.fail_paths:
            await self._reply(writer, self.fail_paths[path], {"error": f"{path} failed (fake)"})
            return True
        if path == "/v1/models":
            await self._reply(writer, 200, {"data": [{"id": "fake"}]})
        elif path == "/weight_info":
            await self._reply(writer, 200, {"weight_version": str(self.version)})
        elif path == "/v1/completions":
            self.requests.append(body)
            self._note()
            return await self._complete(body, reader, writer)
        else:
            self.rpcs.append(path)
            if path == "/update_weight_version":
                self.version = int(body["new_version"])
            await self._reply(writer, 200, {"success": True} if path == "/reset_prefix_cache" else {})
        return True

    def _tokens(self, prompt: list[int], max_tokens: int) -> tuple[int, list[int], str]:
        """(start position in the script, the tokens to send, finish reason)."""
        start = sum(1 for t in prompt if t < 256)
        rest = self.script[start:] + [EOS]
        out = rest[:max_tokens]
        return start, out, "stop" if len(out) == len(rest) else "length"

    async def _complete(self, body: dict, reader, writer) -> bool:
        self.open_streams += 1
        self.peak_streams = max(self.peak_streams, self.open_streams)
        self._note()
        try:
            while self.hold_open:
                await self._release.wait()
            if body["prompt"][0] in self.fail_prompts:
                await self._reply(writer, 500, {"error": "this prompt fails (fake)"})
                return True
            start, tokens, finish = self._tokens(body["prompt"], body["max_tokens"])
            n = body.get("n", 1)
            if not body.get("stream"):
                choices = [{"index": c, "text": decode(tokens), "token_ids": tokens, "finish_reason": finish,
                            "logprobs": {"token_logprobs": [logprob_of(self.version)] * len(tokens)}}
                           for c in range(n)]
                await self._reply(writer, 200, {"choices": choices})
                return True
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            texts = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(n)]
            for pos, token in enumerate(tokens, start):
                if (self.stall_at is not None and start < self.stall_at == pos
                        and (self.stall_prompts is None or body["prompt"][0] in self.stall_prompts)):
                    await self._stall(reader)
                last = pos == start + len(tokens) - 1
                for c in range(n):
                    text = texts[c].decode(bytes([token]) if token < 256 else b"", final=last)
                    await self._event(writer, {"choices": [{
                        "index": c, "text": text, "token_ids": [token], "finish_reason": finish if last else None,
                        "logprobs": {"token_logprobs": [logprob_of(self.version)]}}]})
            await self._event(writer, "[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        finally:
            self.open_streams -= 1
            self._note()

    async def _stall(self, reader: asyncio.StreamReader) -> None:
        """Wait for `release()`; a client that leaves meanwhile (EOF) ends the request."""
        left = asyncio.ensure_future(reader.read(1))
        released = asyncio.ensure_future(self._release.wait())
        try:
            await asyncio.wait({left, released}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
        if left.done():
            raise ConnectionResetError("the client left")
        left.cancel()

    @staticmethod
    async def _event(writer: asyncio.StreamWriter, payload) -> None:
        data = b"data: " + (payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()) + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()
