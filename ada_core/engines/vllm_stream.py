"""Cancellable sample requests to one vLLM server: the engine side of `sampler.schedule: streaming`.

A block of samples (consecutive seeds of one prompt; often a single sample) is one `/v1/completions`
request with n=count, seed=the first seed and `stream: true`, on an asyncio loop in a background
thread. vLLM gives copy k of such a request the sample of seed + k, so a sample is the same whatever
block it went in. Each sample is handed over the moment its own finish chunk arrives, not when its
block ends. Cancelling a block cancels its task, which closes the HTTP connection; vLLM's streaming
response notices the disconnect and aborts the request in the engine, freeing its batch slots and KV
blocks at the next iteration. Streaming is also what tells us how many tokens an aborted sample cost.

A sample's fields follow `vllm_engine.parse_completion`: token ids with EOS kept, processed
log-probs, text without special tokens, truncated when vLLM finished for length.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future

import httpx

from ada_core.occupancy import OccupancyMeter
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt, Sample
from ada_core.protocols import StreamOutcome

# Tokens per streamed chunk (vLLM's per-request `stream_interval`; the first and last chunks always
# come). One chunk per token costs the API server and this client a JSON message per token, CPU that
# a CPU host's server shares with generation; 16 keeps that cost small, and an aborted sample's token
# count is then short by at most 15 tokens (what it generated since its last chunk).
STREAM_INTERVAL = 16


class _Block:
    """One request of `count` samples: `futures[k]` resolves to sample k's StreamOutcome; `cancel()` aborts."""

    def __init__(self, streamer: VLLMSampleStreamer, count: int):
        self.futures: list[Future] = [Future() for _ in range(count)]
        self.tokens = [0] * count
        self._streamer = streamer
        self._task: asyncio.Task | None = None

    def cancel(self) -> None:
        self._streamer._loop.call_soon_threadsafe(self._cancel_in_loop)

    def _cancel_in_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _settle(self, task: asyncio.Task) -> None:
        # Settled from the task's end, so a task cancelled before it ever ran still resolves its futures.
        error = None if task.cancelled() else task.exception()
        for k, future in enumerate(self.futures):
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(StreamOutcome(None, self.tokens[k]))


class VLLMSampleStreamer:
    """Streaming block requests to the server at `base_url` (see the module docstring).

    `error(message)` builds the exception raised for a failed request: the engine passes its own,
    which adds a managed server's exit code and log tail."""

    def __init__(self, base_url: str, model_name: str, *, concurrency: int, request_timeout_s: float,
                 meter: OccupancyMeter, error: Callable[[str], Exception], headers: dict[str, str] | None = None):
        self.base_url, self.model_name = base_url.rstrip("/"), model_name
        self.concurrency, self.meter, self._error = concurrency, meter, error
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-stream", daemon=True)
        self._thread.start()

        # The request timeout bounds connecting, and each wait for the next chunk; not the wait for a free
        # connection (pool=None). A block queued behind `concurrency` live streams is not a stalled request:
        # each of those streams is bounded by its own read timeout, and frees its connection when it ends.
        # With a pool timeout, a slow (loaded) server made queued blocks fail with PoolTimeout.
        timeout = httpx.Timeout(request_timeout_s, pool=None)

        async def setup():
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=headers,
                                             limits=httpx.Limits(max_connections=concurrency,
                                                                 max_keepalive_connections=concurrency))

        asyncio.run_coroutine_threadsafe(setup(), self._loop).result()

    def submit(self, prompt: Prompt, seed: int, count: int, sampling: SamplingParams) -> _Block:
        if not prompt.prompt_ids:
            raise ValueError(f"prompt {prompt.id}: prompt_ids is empty; encode prompts before generating")
        if count < 1:
            raise ValueError(f"prompt {prompt.id}: a block needs >= 1 sample, got {count}")
        block = _Block(self, count)

        def start() -> None:
            block._task = self._loop.create_task(self._run(block, prompt, seed, sampling))
            block._task.add_done_callback(block._settle)

        self._loop.call_soon_threadsafe(start)
        return block

    async def _run(self, block: _Block, prompt: Prompt, seed: int, sampling: SamplingParams) -> None:
        count = len(block.futures)
        body = {
            "model": self.model_name, "prompt": list(prompt.prompt_ids), "n": count, "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": seed, "logprobs": 0,
            "stop": list(sampling.stop), "return_token_ids": True, "skip_special_tokens": True, "stream": True,
            "stream_interval": STREAM_INTERVAL,
        }
        what = f"samples of prompt {prompt.id} (seeds {seed}..{seed + count - 1})"
        ids: list[list[int]] = [[] for _ in range(count)]
        logprobs: list[list[float]] = [[] for _ in range(count)]
        text: list[list[str]] = [[] for _ in range(count)]
        running = count
        self.meter.add(count)
        try:
            async with self._client.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")[:500]
                    raise self._error(f"{what}: {self.base_url}/v1/completions answered {response.status_code}: "
                                      f"{detail}")
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line[6:]
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk or not chunk.get("choices"):
                        raise self._error(f"{what}: the server streamed an error: {payload[:500]}")
                    for choice in chunk["choices"]:
                        k = int(choice.get("index", 0))
                        new_ids = choice.get("token_ids") or []
                        new_lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
                        if not 0 <= k < count or len(new_ids) != len(new_lps) or any(lp is None for lp in new_lps):
                            raise self._error(f"{what}: a malformed chunk for completion {k}: {len(new_ids)} token "
                                              f"ids, {len(new_lps)} log-probs")
                        ids[k].extend(int(t) for t in new_ids)
                        logprobs[k].extend(float(lp) for lp in new_lps)
                        text[k].append(choice.get("text") or "")
                        block.tokens[k] = len(ids[k])
                        finish = choice.get("finish_reason")
                        if finish is not None and not block.futures[k].done():
                            # Handed over now, while its siblings still generate: it is verified meanwhile.
                            self.meter.add(-1)
                            running -= 1
                            block.futures[k].set_result(StreamOutcome(
                                Sample(prompt_id=prompt.id, completion_ids=ids[k], logprobs=logprobs[k],
                                       text="".join(text[k]), truncated=finish == "length"), len(ids[k])))
        except httpx.HTTPError as err:
            raise self._error(f"{what}: request to {self.base_url}/v1/completions failed: {err!r}") from err
        finally:
            self.meter.add(-running)
        unfinished = [k for k, f in enumerate(block.futures) if not f.done()]
        if unfinished:
            raise self._error(f"{what}: the stream ended without finishing completions {unfinished}")

    def close(self) -> None:
        """Cancel what is in flight, close the client, stop the loop's thread and close the loop. Idempotent."""
        async def shutdown():
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()
            await self._client.aclose()

        if self._loop.is_closed():
            return
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
        if not self._thread.is_alive():  # a loop whose thread is stuck cannot be closed; it dies with it
            self._loop.close()  # its selector and self-pipe: two fds per streamer, otherwise left open
