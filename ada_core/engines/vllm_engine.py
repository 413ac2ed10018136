"""The vLLM rollout engine: the `RolloutEngine` protocol over a vLLM server's `/v1/completions`.

One `generate` call serves a whole sampler round: each `(prompt, k)` request becomes one HTTP
request with `n=k`, at most `concurrency` in flight, and vLLM batches them continuously. Prompts go
as token ids, never text, so the server sees exactly the tokens the trainer trains on.

Conventions match `transformers_engine` (the update engine relies on them):
- `completion_ids` keep the EOS token; `text` excludes it.
- `logprobs[t]` is log softmax(logits_t / T)[token_t]: the server runs with
  `--logprobs-mode processed_logprobs`, which at top_p=1 is exactly that. With top_p < 1 vLLM
  renormalises over the nucleus, which the update engine's recompute does not, and the off-policy
  metrics (`update/is_ratio_*`) show the difference.
- `truncated` is True when vLLM finished for length.

Seeding: request i gets seed hash(sampling.seed, i); vLLM gives copy j of it seed + j. So the same
call seed gives the same samples. Under partial rollout `generate` is streamed and unseeded (a load may
split its samples; ada_core/engines/vllm_stream.py says why), and `generate_between_loads`, which
evaluation calls, keeps the seeded requests: no load runs during an evaluation.

Weight sync, once per training step (`sync_weights`), never per sampler round:
1. write the updated weights as safetensors to a sync folder (on /dev/shm where it exists), named for this
   process; a killed run's folder is removed by the next engine's start (`make_sync_dir`);
2. `/pause` (waiting for in-flight requests; there are none between steps);
3. `/collective_rpc` `reload_weights` with that folder: vLLM's layer-wise in-place reload, the one
   that works on CPU after start-up, where linear weights have been repacked;
4. `/reset_prefix_cache`, checking `success`, so no KV block computed by the old weights is reused;
5. `/update_weight_version`, then `/resume`.
Any failure raises `WeightSyncError` naming the stage: the run stops rather than sampling from a
stale policy. Under `rollout.partial_rollout` (`partial`) requests go on across a load: every request
is streamed (`generate` too), the samples in flight are frozen before step 2 and resumed from their
tokens after step 5 (`reload_in_flight`, ada_core/engines/vllm_stream.py).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ada_core import metrics as K
from ada_core.engines.requests import check_requests, check_sampling, row_seed
from ada_core.engines.vllm_server import (API_KEY_ENV, SERVED_MODEL_NAME, VLLMServer, VLLMServerError,
                                          check_sleep_supported)
from ada_core.errors import DiskFull
from ada_core.occupancy import OccupancyMeter
from ada_core.paths import staged
from ada_core.processes import boot_id, start_time
from ada_core.protocols import RolloutEngine, SamplingParams
from ada_core.records import Prompt, Sample

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A weight sync failed; the server may still hold the previous weights."""


@dataclass(frozen=True)
class StagedWeights:
    """Weights written for a later load (`stage_weights` / `load_staged`)."""

    folder: Path
    version: int
    write_s: float


def default_sync_root() -> Path:
    """/dev/shm when it exists (a RAM-backed write and read), else the system temp folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


SYNC_PREFIX = "ada-weight-sync-"


def make_sync_dir(sync_root: str | Path | None) -> Path:
    """A fresh weight-sync folder under `sync_root` (default: `default_sync_root`), named for this process
    (`ada-weight-sync-<pid>.<start time>.<boot>-…`), after removing those of this machine's processes that
    have ended: a killed run leaves its staged weights there, a full copy of the model in RAM on /dev/shm."""
    root = Path(sync_root or default_sync_root())
    remove_orphaned_sync_dirs(root)
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{SYNC_PREFIX}{pid}.{start_time(pid)}.{boot_id()[:8]}-", dir=root))


def remove_orphaned_sync_dirs(root: Path) -> list[Path]:
    """Remove the sync folders under `root` whose process has ended; returns them. Only folders named for a
    process of this machine and boot are touched: another host's (a shared sync_dir) or an unnamed one (made
    before folders carried their owner) is left alone."""
    removed = []
    boot = boot_id()[:8]
    for path in root.glob(f"{SYNC_PREFIX}*"):
        owner = path.name[len(SYNC_PREFIX):].split("-", 1)[0].split(".")
        if len(owner) != 3 or owner[2] != boot or not owner[0].isdigit() or not owner[1].isdigit():
            continue
        if start_time(int(owner[0])) != int(owner[1]):  # that process has ended (its pid free, or reused)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            log.info("removed %s: the weight-sync folder of a process that has ended", path)
    return removed


class VLLMRolloutEngine(RolloutEngine):
    """`RolloutEngine` over a vLLM server, with once-per-step weight sync and optional GPU sleep.

    `server` is the managed `VLLMServer` when this engine launched one (its log tail goes into
    errors, and `close` stops it); None when attaching to a server started elsewhere (`base_url`).
    Every request carries the server's API key: `api_key`, else the launched server's, else
    `$ADA_VLLM_API_KEY` (none: requests go without, for a server started without a key).

    A constructor that fails releases what it made (client, threads, sync folder); the server
    stays with its caller. `decode(ids)`: the tokenizer's text of completion ids without special tokens
    (`completion_decoder`); partial rollout needs it, for a sample resumed after a load.
    """

    def __init__(self, base_url: str, *, server: VLLMServer | None = None, concurrency: int = 64,
                 request_timeout_s: float = 600.0, sync_root: str | Path | None = None,
                 sleep_during_update: bool = False, model_name: str | None = None, api_key: str | None = None,
                 partial: bool = False, decode: Callable[[list[int]], str] | None = None):
        if concurrency < 1:
            raise ValueError(f"rollout.vllm.concurrency must be >= 1, got {concurrency}")
        if sleep_during_update:
            check_sleep_supported()
        if partial and decode is None:
            raise ValueError("rollout.partial_rollout decodes a resumed sample's text from its token ids: the engine "
                             "needs the tokenizer's decode (`decode`)")
        self.decode = decode
        self.base_url = base_url.rstrip("/")
        self.server = server
        self.concurrency = concurrency
        self.sleep_during_update = sleep_during_update
        self.partial = partial  # rollout.partial_rollout: requests go on across a weight load (`load_staged`)
        self.weight_version: int | None = None
        api_key = api_key or (server.api_key if server is not None else None) or os.environ.get(API_KEY_ENV)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, timeout=request_timeout_s, headers=self._headers,
                                    limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency))
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="vllm-request")
        self.meter = OccupancyMeter(concurrency)  # sequences in flight: rollout/idle_fraction
        self._request_timeout_s = request_timeout_s
        self._streamer = None  # per-sample requests for sampler.schedule=streaming, made on first use
        self._sync_dir = None
        try:
            self._sync_dir = make_sync_dir(sync_root)
            self.model_name = model_name or self._served_model()
        except BaseException:
            self._release()
            raise

    # --- the rollout protocol ----------------------------------------------------------------

    def generate(self, requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams) -> list[list[Sample]]:
        """Return, for each `(prompt, k)` request, exactly k unscored Samples, in request order."""
        if not self.partial:
            return self.generate_between_loads(requests, sampling)
        check_requests(requests, sampling)  # streamed, so a weight load can stop and resume them; unseeded
        base_seed = sampling.seed if sampling.seed is not None else random.SystemRandom().getrandbits(62)
        return generate_streamed(self, requests, sampling, base_seed)

    def generate_between_loads(self, requests: Sequence[tuple[Prompt, int]],
                               sampling: SamplingParams) -> list[list[Sample]]:
        """`generate` for a call no weight load can interrupt (evaluation): one seeded request per row even
        under partial rollout, so the same call seed gives the same samples."""
        check_requests(requests, sampling)
        base_seed = sampling.seed if sampling.seed is not None else random.SystemRandom().getrandbits(62)
        futures = {i: self._pool.submit(self._complete, prompt, k, row_seed(base_seed, i, 0) >> 1, sampling)
                   for i, (prompt, k) in enumerate(requests) if k > 0}
        return [futures[i].result() if i in futures else [] for i in range(len(requests))]

    def _complete(self, prompt: Prompt, k: int, seed: int, sampling: SamplingParams) -> list[Sample]:
        body = {
            "model": self.model_name,
            "prompt": list(prompt.prompt_ids),
            "n": k,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed,
            "logprobs": 0,
            "stop": list(sampling.stop),
            "return_token_ids": True,
            "skip_special_tokens": True,
        }
        with self.meter.running(k):
            data = self._post("/v1/completions", body, what=f"completion for prompt {prompt.id}")
        return parse_completion(prompt, k, data)

    def submit(self, prompt: Prompt, seed: int, count: int, sampling: SamplingParams):
        """`count` cancellable samples, seeds seed..seed+count-1: the `StreamingRolloutEngine` protocol
        (ada_core/sampling/streaming.py), served by ada_core/engines/vllm_stream.py."""
        check_sampling(sampling)
        if self._streamer is None:
            from ada_core.engines.vllm_stream import VLLMSampleStreamer

            self._streamer = VLLMSampleStreamer(self.base_url, self.model_name, concurrency=self.concurrency,
                                                request_timeout_s=self._request_timeout_s, meter=self.meter,
                                                error=self._server_error, headers=self._headers,
                                                partial=self.partial, version=self.weight_version,
                                                decode=self.decode)
        return self._streamer.submit(prompt, seed, count, sampling)

    # --- weight sync ---------------------------------------------------------------------------

    def sync_weights(self, module, version: int) -> dict[str, float]:
        """Load `module`'s weights into the server as weight version `version` (see the module docstring).

        Returns timings: `sync/write_s` (safetensors to the sync folder) and `sync/reload_s` (the
        server's pause..resume); raises WeightSyncError naming the failed stage."""
        return self.load_staged(self.stage_weights(module, version))

    def stage_weights(self, module, version: int) -> StagedWeights:
        """Step 1 alone: write `module`'s weights now, for `load_staged` later (`rollout.async_steps`:
        the trainer writes them before its next update changes them; the rollout thread loads them
        between two batches, so no sample is ever in flight across a weight change)."""
        folder = self._sync_dir / f"v{version}"
        start = time.perf_counter()
        write_weights(module, folder, version)
        return StagedWeights(folder, version, time.perf_counter() - start)

    def load_staged(self, staged: StagedWeights) -> dict[str, float]:
        """Steps 2-5 on weights `stage_weights` wrote; the folder is removed after. Under partial rollout
        the samples in flight are frozen around them (`reload_in_flight`)."""
        start = time.perf_counter()
        partial: dict[str, float] = {}
        try:
            if self.partial:
                partial[K.SYNC_FROZEN_SAMPLES] = float(self.reload_in_flight(staged.folder, staged.version))
            else:
                self.reload_weights(staged.folder, staged.version)
        finally:
            shutil.rmtree(staged.folder, ignore_errors=True)
        return {**partial, K.SYNC_WRITE_S: staged.write_s, K.SYNC_RELOAD_S: time.perf_counter() - start,
                K.SYNC_WEIGHT_VERSION: float(staged.version), K.ROLLOUT_NUM_SERVERS: 1.0,
                K.ROLLOUT_SERVERS_ALIVE: 1.0}

    def reload_weights(self, folder: Path, version: int) -> None:
        """Steps 2-5 of the sync: the server reloads the safetensors in `folder` as weight version `version`."""
        paused = False
        try:
            self._rpc("/pause", params={"mode": "wait"}, stage="pause", version=version)
            paused = True
            self._rpc("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                      stage="reload_weights", version=version)
            reset = self._rpc("/reset_prefix_cache", stage="reset_prefix_cache", version=version)
            if not (isinstance(reset, dict) and reset.get("success") is True):
                raise WeightSyncError(f"weight sync to version {version}: {self.base_url}/reset_prefix_cache answered {reset!r}; "
                                      "KV blocks from the old weights could be reused")
            self._rpc("/update_weight_version", {"new_version": str(version)}, stage="update_weight_version",
                      version=version)
            self._rpc("/resume", stage="resume", version=version)
            paused = False
        finally:
            if paused:  # leave the server usable for a post-mortem; the step still fails
                try:
                    self._client.post("/resume")
                except httpx.HTTPError:
                    pass
        self.weight_version = version

    def reload_in_flight(self, folder: Path, version: int) -> int:
        """Partial rollout's load: stop the samples in flight (each keeps the tokens it has, every one of
        them sampled and stamped on the old weights), reload with nothing running on the server (so the
        prefix cache resets and no old KV block is reused), then resume each from its tokens on the new
        weights: the server recomputes their prefix, so every later token and its log-prob are the new
        version's. Returns the samples frozen. vLLM's pause(mode="keep") would keep their KV blocks instead, but
        the tokens a frozen request had generated and not yet streamed would come back after the resume
        with the new tokens, and could not be told apart from them.

        A failure anywhere (the freeze, the reload, the thaw) fails every sample not yet handed over with one
        error naming this server (a dead server's carries its log tail, and a pool re-sends them elsewhere), and
        every later block with it: nothing waits on a server whose weights are unknown. The error is raised."""
        streamer = self._streamer
        if streamer is None:
            self.reload_weights(folder, version)
            return 0
        try:
            frozen = streamer.freeze()
            self.reload_weights(folder, version)
            streamer.thaw(self.weight_version)
        except BaseException as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            streamer.fail(self._server_error(f"weight sync to version {version} on {self.base_url} failed, so its "
                                             f"samples in flight were stopped: {first}"))
            if isinstance(err, (WeightSyncError, VLLMServerError)):
                raise
            raise WeightSyncError(f"weight sync to version {version} on {self.base_url}: stopping or resuming the "
                                  f"samples in flight failed: {err!r}") from err
        return frozen

    def server_counts(self) -> dict[str, float]:
        return {K.ROLLOUT_NUM_SERVERS: 1.0, K.ROLLOUT_SERVERS_ALIVE: 1.0}  # a dead server fails the step

    def set_weight_version(self, version: int) -> None:
        """Label the weights the server already holds (a server launched on the run's current folder)."""
        self._rpc("/update_weight_version", {"new_version": str(version)}, stage="update_weight_version",
                  version=version)
        self.weight_version = version

    def server_weight_version(self) -> str | None:
        """The weight version the server reports (`/weight_info`)."""
        response = self._client.get("/weight_info")
        response.raise_for_status()
        return response.json().get("weight_version")

    # --- sleep mode (one GPU shared with the trainer) -------------------------------------------

    def sleep(self) -> None:
        """Offload weights and drop the KV cache (level 1) while the trainer updates."""
        if self.sleep_during_update:
            self._rpc("/sleep", params={"level": 1}, stage="sleep", version=self.weight_version)

    def wake_up(self) -> None:
        if self.sleep_during_update:
            self._rpc("/wake_up", stage="wake_up", version=self.weight_version)

    # --- plumbing ------------------------------------------------------------------------------

    def close(self) -> None:
        try:
            self._release()
        finally:
            if self.server is not None:
                self.server.stop()

    def _release(self) -> None:
        """Everything this engine made, the server aside: streamer, request threads, client, sync folder."""
        try:
            if self._streamer is not None:
                self._streamer.close()
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._client.close()
            if self._sync_dir is not None:
                shutil.rmtree(self._sync_dir, ignore_errors=True)

    def _served_model(self) -> str:
        try:
            data = self._client.get("/v1/models").raise_for_status().json()
        except httpx.HTTPError as err:
            raise self._server_error(f"cannot list models at {self.base_url}/v1/models: {err}") from err
        names = [m.get("id") for m in data.get("data", [])]
        if not names:
            raise VLLMServerError(f"vLLM server at {self.base_url} serves no model")
        return SERVED_MODEL_NAME if SERVED_MODEL_NAME in names else names[0]

    def _post(self, path: str, body: dict[str, Any], what: str) -> Any:
        try:
            response = self._client.post(path, json=body)
        except httpx.HTTPError as err:
            raise self._server_error(f"{what}: request to {self.base_url}{path} failed: {err!r}") from err
        if response.status_code != 200:
            raise self._server_error(f"{what}: {self.base_url}{path} answered {response.status_code}: "
                                     f"{response.text[:500]}")
        return response.json()

    def _rpc(self, path: str, body: dict[str, Any] | None = None, *, params: dict[str, Any] | None = None,
             stage: str, version: int | None) -> Any:
        try:
            response = self._client.post(path, json=body, params=params)
        except httpx.HTTPError as err:
            raise WeightSyncError(self._server_error(
                f"weight sync to version {version}: {stage} ({self.base_url}{path}) failed: {err!r}").args[0]) from err
        if response.status_code != 200:
            raise WeightSyncError(f"weight sync to version {version}: {stage} ({self.base_url}{path}) answered "
                                  f"{response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def _server_error(self, message: str) -> VLLMServerError:
        """An error carrying the managed server's state: its exit code and log tail when it died."""
        if self.server is not None:
            try:
                self.server.check_alive()
            except VLLMServerError as dead:
                return VLLMServerError(f"{message}\n{dead}")
        return VLLMServerError(message)


def completion_decoder(tokenizer) -> Callable[[list[int]], str]:
    """A completion's text from its ids as vLLM's `skip_special_tokens` gives it (EOS and other special
    tokens left out)."""
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def generate_streamed(engine, requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams,
                      base_seed: int) -> list[list[Sample]]:
    """`generate` as streamed blocks (`engine.submit`), for partial rollout: request i is a block of k samples
    starting at the seed the unstreamed request would have (the streamer sends no seed under partial rollout,
    so these are not the seeded path's samples)."""
    blocks = {i: engine.submit(prompt, row_seed(base_seed, i, 0) >> 1, k, sampling)
              for i, (prompt, k) in enumerate(requests) if k > 0}
    out = []
    for i, (prompt, _) in enumerate(requests):
        samples = [f.result().sample for f in blocks[i].futures] if i in blocks else []
        if any(s is None for s in samples):
            raise VLLMServerError(f"prompt {prompt.id}: a sample was aborted that nothing cancelled")
        out.append(samples)
    return out


def write_weights(module, folder: Path, version: int) -> None:
    """Step 1 of the sync: `module`'s weights as safetensors in `folder` (replacing what was there).
    A full disk (/dev/shm is memory) is one DiskFull line, the partial folder removed."""
    needs = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    try:
        shutil.rmtree(folder, ignore_errors=True)
        with staged(folder, f"the weights of version {version}", needs):
            module.save_pretrained(folder, safe_serialization=True)
    except DiskFull:
        raise
    except Exception as err:
        raise WeightSyncError(f"weight sync to version {version}: writing safetensors to {folder} failed: {err}") from err


def parse_completion(prompt: Prompt, k: int, data: dict[str, Any]) -> list[Sample]:
    """Samples from a `/v1/completions` answer with `return_token_ids` and `logprobs=0`.

    A malformed answer raises VLLMServerError naming the prompt and the missing field."""
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != k:
        raise VLLMServerError(f"prompt {prompt.id}: asked for {k} completions, the server returned {len(choices)}")
    samples = []
    for choice in choices:
        ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if ids is None or logprobs is None:
            raise VLLMServerError(f"prompt {prompt.id}: completion {choice.get('index')} lacks "
                                  f"{'token_ids' if ids is None else 'logprobs.token_logprobs'}")
        if len(ids) != len(logprobs) or any(lp is None for lp in logprobs):
            raise VLLMServerError(f"prompt {prompt.id}: completion {choice.get('index')} has {len(ids)} token ids "
                                  f"but {len(logprobs)} log-probs")
        samples.append(Sample(prompt_id=prompt.id, completion_ids=[int(t) for t in ids],
                              logprobs=[float(lp) for lp in logprobs], text=choice.get("text") or "",
                              truncated=choice.get("finish_reason") == "length"))
    return samples
