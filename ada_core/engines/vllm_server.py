"""Start, watch and stop a vLLM OpenAI-compatible server in its own environment.

vLLM cannot share our venv (its fastapi and torch pins conflict with Prefect's), so it runs as a
server from `.venv-vllm` (built by `make vllm-env`, recipe in `infra/vllm/`) and the trainer talks
to it over HTTP on loopback. The launcher:

- starts `python -m vllm.entrypoints.openai.api_server` with `VLLM_SERVER_DEV_MODE=1`, which
  exposes the endpoints weight sync needs (`/pause`, `/collective_rpc`, `/reset_prefix_cache`, ...);
- gives each server a random API key (`api_key`, handed over in its environment, never on its
  command line, in a log or in the config) that every request must carry, the dev endpoints
  included (vllm_side/ada_vllm_guard.py: vLLM's own `--api-key` guards only /v1 and a few others);
  only /health answers without it;
- runs it under vllm_side/ada_vllm_launch.py, which ends it when this process dies, SIGKILL
  included (a lifeline pipe whose write end only this process holds);
- captures stdout and stderr in a log file;
- waits for `/health` with a timeout, and reports a server that dies (or never answers) with the
  last lines of its log; a port chosen here that another process bound meanwhile (servers started
  in parallel) is replaced by a fresh one and the start retried;
- stops it with SIGTERM to its whole process group (vLLM forks an engine-core process), then SIGKILL.
  The launcher leads that group and is reaped only once the group has been signalled for the last
  time (`exit_code` looks without reaping): until then no other process can be given its pid, so the
  group's number is still ours, however long ago the launcher ended (a pool's failover may see it
  die hours before `close`).

Usage:
    with VLLMServer(model_dir, max_model_len=256) as server:
        engine = VLLMRolloutEngine(server.base_url, server=server)
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

SERVED_MODEL_NAME = "ada-policy"
# The key of a server this process did not launch (`rollout.vllm.base_url`/`base_urls`): from the
# environment only, since the config is logged as MLflow params.
API_KEY_ENV = "ADA_VLLM_API_KEY"
_REPO_ROOT = Path(__file__).resolve().parents[2]
_SIDE = Path(__file__).resolve().with_name("vllm_side")
_LOG_TAIL_LINES = 30
_PORT_ATTEMPTS = 3


class VLLMServerError(RuntimeError):
    """The vLLM server could not start, died, or stopped answering. The message holds its log tail."""


def vllm_python() -> Path:
    """The interpreter of the vLLM environment: `$ADA_VLLM_PYTHON`, else `.venv-vllm/bin/python`."""
    configured = os.environ.get("ADA_VLLM_PYTHON")
    path = Path(configured) if configured else _REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if not path.exists():
        raise VLLMServerError(
            f"no vLLM environment at {path}: run `make vllm-env` (or set ADA_VLLM_PYTHON to the python of an "
            "environment with vllm installed)"
        )
    return path


def cuda_available() -> bool:
    """Whether this machine has a CUDA GPU, by the trainer's torch (the server runs on the same machine)."""
    import torch

    return torch.cuda.is_available()


def check_sleep_supported() -> None:
    """vLLM's sleep mode frees GPU memory through CUDA's allocator; there is nothing like it on CPU."""
    if not cuda_available():
        raise VLLMServerError(
            "rollout.vllm.sleep_during_update=true needs a CUDA GPU: vLLM's sleep mode (/sleep, /wake_up) is "
            "GPU-only, and this machine has none. Leave it false on CPU."
        )


def check_engine_config(config) -> None:
    """Fail early, naming the field, when `config` (a TrainConfig) asks for vLLM where it cannot run:
    no environment and no server to attach to, or sleep mode on a machine without CUDA."""
    from ada_core.config import ConfigError

    if config.rollout.engine != "vllm":
        return
    vllm = config.rollout.vllm
    if vllm.base_url is None and not vllm.base_urls:
        try:
            vllm_python()
        except VLLMServerError as err:
            raise ConfigError(f"rollout.engine: 'vllm' cannot start here: {err}") from None
    if vllm.sleep_during_update and not cuda_available():
        raise ConfigError("rollout.vllm.sleep_during_update: vLLM's sleep mode is CUDA-only and this machine has "
                          "no GPU; leave it false on CPU")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """One vLLM server process serving `model_dir` on `host` (127.0.0.1 unless given: `ada vllm-serve`).

    `dtype` is passed to `--dtype` ("float32" on CPU keeps log-probs comparable with the fp32
    trainer). `gpu_memory_utilization` is used only on CUDA; on CPU the KV cache size is
    `cpu_kvcache_gib` (VLLM_CPU_KVCACHE_SPACE). `enable_sleep_mode` is refused on CPU. `api_key` is
    the key every request must carry: a random one unless given; never logged (it is not in `args`).
    """

    def __init__(self, model_dir: str | Path, *, max_model_len: int | None = None, dtype: str = "float32",
                 port: int = 0, python: str | Path | None = None, log_path: str | Path | None = None,
                 gpu_memory_utilization: float = 0.5, cpu_kvcache_gib: int = 1, enforce_eager: bool = True,
                 enable_sleep_mode: bool = False, startup_timeout_s: float = 300.0,
                 extra_args: Sequence[str] = (), api_key: str | None = None, host: str = "127.0.0.1"):
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise VLLMServerError(f"model folder {self.model_dir} has no config.json; give an HF model folder")
        if enable_sleep_mode:
            check_sleep_supported()
        self.python = Path(python) if python else vllm_python()
        self._own_port = not port  # chosen here: another may bind it first, then another is chosen
        self.port = port or free_port()
        self.host = host
        self.api_key = api_key or secrets.token_urlsafe(32)  # random unless given (a pool's servers share one)
        self.log_path = Path(log_path) if log_path else self.model_dir.parent / f"vllm-server-{self.port}.log"
        self.startup_timeout_s = startup_timeout_s
        self.enable_sleep_mode = enable_sleep_mode
        self.cuda = cuda_available()
        args = [
            "--model", str(self.model_dir), "--served-model-name", SERVED_MODEL_NAME,
            "--host", self.host, "--dtype", dtype, "--middleware", "ada_vllm_guard.RequireApiKey",
            # Behaviour log-probs after temperature (and top-p): at top_p=1 exactly the trainer's
            # log softmax(logits / T), the convention of the transformers engine.
            "--logprobs-mode", "processed_logprobs",
            "--disable-log-stats", "--uvicorn-log-level", "warning",
        ]
        if max_model_len:
            args += ["--max-model-len", str(max_model_len)]
        if enforce_eager:
            args.append("--enforce-eager")
        if self.cuda:
            args += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
        if enable_sleep_mode:
            args.append("--enable-sleep-mode")
        self._server_args = args + list(extra_args)
        self.env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_API_KEY": self.api_key,  # vLLM's own check on /v1 and the guard's on every other path
            "VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP", "127.0.0.1"),  # its internal rendezvous: loopback
            "VLLM_CPU_KVCACHE_SPACE": str(cpu_kvcache_gib),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        # Our venv's variables would leak the wrong site-packages into the server's interpreter; the
        # guard middleware is the one module of ours it imports.
        self.env.pop("VIRTUAL_ENV", None)
        self.env.pop(API_KEY_ENV, None)
        self.env["PYTHONPATH"] = str(_SIDE)
        self.process: subprocess.Popen | None = None
        self._log_file = None
        self._lifeline: int | None = None  # the write end of the launcher's lifeline pipe

    @property
    def args(self) -> list[str]:
        """The launcher's command line: the vLLM server's, behind the lifeline's fd."""
        return [str(self.python), str(_SIDE / "ada_vllm_launch.py"), "{lifeline}", str(self.python), "-m",
                "vllm.entrypoints.openai.api_server", *self._server_args, "--port", str(self.port)]

    @property
    def headers(self) -> dict[str, str]:
        """What a client sends with every request."""
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> VLLMServer:
        """Launch and wait until `/health` answers; raise VLLMServerError (with the log tail) otherwise."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                return self._start()
            except _PortTaken:
                if attempt == _PORT_ATTEMPTS:
                    raise VLLMServerError(f"vLLM could not bind a free port in {_PORT_ATTEMPTS} tries (another "
                                          f"process took each first)\n{self.log_tail()}") from None
                log.warning("port %d was taken before vLLM bound it; retrying on another", self.port)
                self.port = free_port()

    def _start(self) -> VLLMServer:
        if self.process is not None:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        log_start = self._log_file.tell()
        log.info("starting vLLM on %s for %s (log: %s)", self.base_url, self.model_dir, self.log_path)
        read_end, self._lifeline = os.pipe()  # both non-inheritable: only the launcher gets the read end
        try:
            args = [str(read_end) if a == "{lifeline}" else a for a in self.args]
            self.process = subprocess.Popen(args, stdout=self._log_file, stderr=subprocess.STDOUT, env=self.env,
                                            stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(read_end,))
        except BaseException:
            self._close_lifeline()
            raise
        finally:
            os.close(read_end)
        started = time.monotonic()
        try:
            while True:
                if (code := self.exit_code()) is not None:
                    if self._own_port and _bind_failed(self.log_path, log_start):
                        raise _PortTaken()
                    raise VLLMServerError(f"vLLM server exited with code {code} while starting\n{self.log_tail()}")
                if self.healthy():
                    log.info("vLLM healthy after %.1fs", time.monotonic() - started)
                    return self
                if time.monotonic() - started > self.startup_timeout_s:
                    raise VLLMServerError(
                        f"vLLM server did not answer /health within {self.startup_timeout_s:.0f}s\n{self.log_tail()}")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def exit_code(self) -> int | None:
        """The launcher's exit code once it has ended (-N: killed by signal N); None while it runs or
        before `start`. It is not reaped here (see `stop`)."""
        return None if self.process is None else _exit_code(self.process)

    def check_alive(self) -> None:
        """Raise VLLMServerError with the log tail if the process has exited."""
        if self.process is None:
            raise VLLMServerError("vLLM server was never started")
        code = self.exit_code()
        if code is not None:
            raise VLLMServerError(f"vLLM server (pid {self.process.pid}) died with exit code {code}\n{self.log_tail()}")

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {self.log_path})"
        return f"last {min(lines, len(text))} lines of {self.log_path}:\n" + "\n".join(text[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after `timeout` seconds. Idempotent.

        The group is signalled only while its leader, the launcher, is not reaped (its number cannot be
        anyone else's then), and the launcher is reaped last."""
        process, self.process = self.process, None
        if process is not None:
            if _exit_code(process) is None:
                _signal_group(process, signal.SIGTERM)
                if not _wait_exit(process, timeout):
                    _signal_group(process, signal.SIGKILL)
                    _wait_exit(process, timeout)
            _signal_group(process, signal.SIGKILL)  # orphans of the group (the engine-core process)
            process.wait(timeout=timeout)
        self._close_lifeline()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):  # a server must never outlive its owner
        if getattr(self, "process", None) is not None and sys is not None:
            self.stop(timeout=5.0)


class _PortTaken(Exception):
    """The server exited at start-up because its port was bound by another process meanwhile."""


def _bind_failed(log_path: Path, offset: int) -> bool:
    """Whether the log written since `offset` says the server could not bind its port."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return False
    return "Address already in use" in text or "[Errno 98]" in text


def _exit_code(process: subprocess.Popen) -> int | None:
    """`process.poll()` without reaping: the exit code (-N for signal N) once it has ended, else None."""
    if process.returncode is not None:  # reaped already (Popen.wait or poll elsewhere)
        return process.returncode
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped outside Popen: Popen records what it can
        return process.poll()
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _wait_exit(process: subprocess.Popen, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `process` to end, without reaping it; whether it ended."""
    deadline = time.monotonic() + timeout
    while _exit_code(process) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    """`sig` to the process group `process` leads, only while `process` is not reaped: a reaped
    leader's number may since lead another process's group."""
    if process.returncode is not None:
        return
    try:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        os.killpg(process.pid, sig)
    except (ChildProcessError, ProcessLookupError, PermissionError):
        pass
