"""Every request to a launched vLLM server needs its API key, the dev endpoints included.

vLLM's `--api-key` (or `VLLM_API_KEY`) guards only paths under /v1, /v2, /inference and /cohere
(vllm/entrypoints/serve/middleware/authenticate.py, GUARDED_PREFIX, vLLM 0.32), so with
VLLM_SERVER_DEV_MODE=1 any local user could call /collective_rpc, /pause, /sleep or /reset_prefix_cache
without it. This middleware (`--middleware ada_vllm_guard.RequireApiKey`) checks
`Authorization: Bearer <VLLM_API_KEY>` on every path but /health, which the launcher polls and which
says nothing but "up". The key comes from the environment only, never argv (which `ps` shows).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

OPEN_PATHS = ("/health",)


class RequireApiKey:
    def __init__(self, app):
        key = os.environ.get("VLLM_API_KEY")
        if not key:
            raise RuntimeError("ada_vllm_guard: VLLM_API_KEY is not set; the launcher sets it")
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def _allowed(self, scope) -> bool:
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    hashlib.sha256(token.encode("latin-1")).digest(), self._digest)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS or self._allowed(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": "Unauthorized: this server needs its API key"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
