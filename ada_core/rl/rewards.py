r"""The math-verify verifier: answer extraction, an in-process integer fast path, and a process pool
with a hard per-item timeout.

Why a pool of killable processes: math-verify (sympy) can hang on adversarial answers such as
`\boxed{9^{9^{9^{9^{9}}}}}`, and its own timeout uses `signal.alarm`, which only works in the main
thread (Prefect runs tasks in threads). So the checking runs in worker processes with math-verify's
timeouts disabled, and the parent enforces the timeout by killing the stuck worker and starting a
fresh one. `concurrent.futures.ProcessPoolExecutor` cannot kill one stuck worker, hence our own pool.

Batching: items go to a worker in chunks (one message per chunk). The worker streams back one small
result per item as it finishes, so the parent knows exactly which item is running: when an item
exceeds `timeout_s`, only that item gets status `timeout`; the rest of its chunk is requeued on the
other workers (or the fresh one) without losing time on retries.

A step's deadline: the per-item timeout bounds one answer, not a batch (k answers built to hang cost
k x timeout_s / workers). `verify(items, within_s)` gives the batch a deadline: what is not scored by
then gets status `deadline` (reward 0) and the workers still on an item are replaced. `StepBudget`
shares one budget between the verify calls of a training step (`verifier.step_budget_s`).

Worked example:
    >>> v = MathVerifier(timeout_s=5.0)
    >>> p = Prompt(id="q1", text="1/2 as a decimal?", answer="\\frac{1}{2}")
    >>> [x.reward for x in v.verify([(p, "so \\boxed{0.5}"), (p, "no box: 0.5")])]
    [1.0, 0.0]                                   # statuses: ok, parse_error
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from ada_core.protocols import Verdict
from ada_core.records import Prompt, VerifierStatus

log = logging.getLogger(__name__)

_INTEGER = re.compile(r"[+-]?\d+")
_BOXED = re.compile(r"\\boxed\s*\{")
_BRACE = re.compile(r"[{}]")
# Completions up to this many characters have their answer extracted here (linear time, well under
# a millisecond); longer ones are extracted in a worker, inside the per-item hard timeout, so no
# completion a policy can emit stalls the calling process.
MAX_INLINE_CHARS = 8192
_READY = "ready"
_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take a while
_MAX_CHUNK = 64
_MAX_FAILED_STARTS = 3


def last_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` whose braces balance, or None.

    >>> last_boxed(r"first \boxed{1}, then \boxed{\frac{1}{2}}.")
    '\\frac{1}{2}'
    >>> last_boxed(r"\boxed{3} and a truncated \boxed{4")   # the last balanced one wins
    '3'
    """
    # One pass pairs every brace from the first \boxed on (a stack of open positions), so the cost is
    # linear in the text: rescanning from each of 16k unclosed `\boxed{` took 46 s on 112 KB.
    starts = [match.end() for match in _BOXED.finditer(text)]
    if not starts:
        return None
    close_of: dict[int, int] = {}
    open_at: list[int] = []
    for brace in _BRACE.finditer(text, starts[0] - 1):
        if brace.group() == "{":
            open_at.append(brace.start())
        elif open_at:
            close_of[open_at.pop()] = brace.start()
    for start in reversed(starts):
        end = close_of.get(start - 1)
        if end is not None:
            return text[start:end].strip()
    return None


def _answer_format(prompt: Prompt) -> str:
    fmt = prompt.meta.get("answer_format", "boxed")
    if fmt not in ("boxed", "plain"):
        raise ValueError(f"prompt {prompt.id}: meta.answer_format must be 'boxed' or 'plain', got {fmt!r}")
    return fmt


def _extract(fmt: str, completion: str) -> str | None:
    return last_boxed(completion) if fmt == "boxed" else completion.strip()


def extract_answer(prompt: Prompt, completion: str) -> str | None:
    """The answer part of a completion, per `prompt.meta["answer_format"]` (`boxed`, the default, or `plain`)."""
    return _extract(_answer_format(prompt), completion)


class MathVerifier:
    """Batched math-verify scoring; implements the `Verifier` protocol.

    Reward is 1.0 when the extracted answer equals `prompt.answer` under math-verify, else 0.0. Status
    `parse_error` means no answer could be extracted or parsed; `timeout` means the item ran past
    `timeout_s` and its worker was killed. Integer-vs-integer items are compared in-process (the
    arithmetic task scores thousands per step); everything else goes to `workers` worker processes
    (fresh interpreters), started lazily on first use. Thread-safe (calls are serialised); close() or use as a context
    manager; workers are also reaped at interpreter exit.
    """

    def __init__(self, timeout_s: float = 5.0, workers: int = 2, memory_limit_mb: int | None = 4096):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.timeout_s = float(timeout_s)
        self.num_workers = workers
        self.memory_limit_mb = memory_limit_mb
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._failed_starts = 0  # consecutive workers that died before becoming ready
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    # --- public API ---------------------------------------------------------------------------

    def verify(self, items: Sequence[tuple[Prompt, str]], within_s: float | None = None) -> list[Verdict]:
        """One verdict per item; with `within_s`, what is not scored that many seconds from now scores 0
        with status `deadline` (the integer fast path always scores: it takes microseconds)."""
        deadline = None if within_s is None else time.monotonic() + max(0.0, within_s)
        verdicts: list[Verdict | None] = [None] * len(items)
        jobs: list[tuple[str, str, str, str]] = []
        job_rows: list[int] = []
        for row, (prompt, completion) in enumerate(items):
            gold = str(prompt.answer).strip()
            if len(completion) > MAX_INLINE_CHARS and gold:
                jobs.append(("extract_verify", gold, completion, _answer_format(prompt)))
                job_rows.append(row)
                continue
            answer = extract_answer(prompt, completion)
            if not answer or not gold:
                verdicts[row] = Verdict(0.0, VerifierStatus.PARSE_ERROR)
            elif _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(gold):
                verdicts[row] = Verdict(1.0 if int(answer) == int(gold) else 0.0, VerifierStatus.OK)
            else:
                jobs.append(("verify", gold, answer, ""))
                job_rows.append(row)
        if jobs:
            results = self._run(jobs, timeout_result=(0.0, "timeout"), crash_result=(0.0, "parse_error"),
                                deadline=deadline, deadline_result=(0.0, "deadline"))
            for row, (reward, status) in zip(job_rows, results):
                verdicts[row] = Verdict(reward, VerifierStatus(status))
        return verdicts  # type: ignore[return-value]

    def parses(self, answers: Sequence[str]) -> list[bool]:
        """Whether each gold answer parses with math-verify and verifies against itself (curation filter)."""
        out: list[bool | None] = [None] * len(answers)
        jobs, rows = [], []
        for row, answer in enumerate(answers):
            answer = str(answer).strip()
            if not answer:
                out[row] = False
            elif _INTEGER.fullmatch(answer):
                out[row] = True
            else:
                jobs.append(("parse", answer, "", ""))
                rows.append(row)
        if jobs:
            for row, ok in zip(rows, self._run(jobs, timeout_result=False, crash_result=False)):
                out[row] = bool(ok)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> "MathVerifier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the pool -----------------------------------------------------------------------------

    def _run(self, jobs: list[tuple[str, str, str, str]], timeout_result: Any, crash_result: Any,
             deadline: float | None = None, deadline_result: Any = None) -> list[Any]:
        """Run jobs on the workers; a job past `timeout_s` (or one whose worker dies) gets the given result,
        and every job still unscored at `deadline` (time.monotonic()) gets `deadline_result`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("MathVerifier is closed")
            while len(self._workers) < self.num_workers:
                self._workers.append(_Worker(self.memory_limit_mb))
            results: list[Any] = [None] * len(jobs)
            todo: deque[int] = deque(range(len(jobs)))
            chunk = max(1, min(_MAX_CHUNK, math.ceil(len(jobs) / self.num_workers)))
            while todo or any(w.inflight for w in self._workers):
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self._miss_deadline(results, todo, deadline_result)
                    break
                for slot, w in enumerate(self._workers):
                    if w.ready and not w.inflight and todo:
                        indices = [todo.popleft() for _ in range(min(chunk, len(todo)))]
                        sent = w.send(indices, jobs, now + self.timeout_s)
                        if not sent:  # it died while idle (killed from outside): its chunk goes back
                            self._replace(slot, todo)
                busy = [w for w in self._workers if w.inflight or not w.ready]
                next_deadline = min(w.deadline if w.ready else w.started + _STARTUP_TIMEOUT_S for w in busy)
                if deadline is not None:
                    next_deadline = min(next_deadline, deadline)
                wait([w.conn for w in busy], timeout=max(0.0, next_deadline - now))
                for slot, w in enumerate(self._workers):
                    was_ready = w.ready
                    if w.drain(results, self.timeout_s):
                        if w.ready and not was_ready:
                            self._failed_starts = 0
                        continue
                    if not w.ready:  # died while starting: retry a few times, then the environment is broken
                        self._failed_starts += 1
                        if self._failed_starts >= _MAX_FAILED_STARTS:
                            raise RuntimeError(f"{self._failed_starts} verifier workers in a row exited during "
                                               f"start-up (last exit code {w.proc.wait(timeout=5)})")
                    elif w.inflight:  # died on an item (e.g. killed by the OS): that item scores 0
                        results[w.inflight.popleft()] = crash_result
                    self._replace(slot, todo)
                now = time.monotonic()
                for slot, w in enumerate(self._workers):
                    if w.ready and w.inflight and now >= w.deadline:
                        results[w.inflight.popleft()] = timeout_result
                        log.warning("verifier item exceeded %.1fs; restarting its worker", self.timeout_s)
                        self._replace(slot, todo)
                    elif not w.ready and now >= w.started + _STARTUP_TIMEOUT_S:
                        raise RuntimeError(f"verifier worker did not start within {_STARTUP_TIMEOUT_S:.0f}s")
            return results

    def _miss_deadline(self, results: list[Any], todo: deque[int], result: Any) -> None:
        """The batch's deadline passed: what finished meanwhile is kept, every other job gets `result`,
        and each worker still on a job is replaced (it may be on one that never returns)."""
        for slot, w in enumerate(self._workers):
            if not w.drain(results, self.timeout_s) or w.inflight:
                todo.extend(w.inflight)
                w.inflight.clear()
                self._replace(slot, deque())
        missed = [index for index in todo if results[index] is None]
        for index in missed:
            results[index] = result
        todo.clear()
        if missed:
            log.warning("verifier: %d item(s) not scored within the batch's deadline; they score 0 (status deadline)",
                        len(missed))

    def _replace(self, slot: int, todo: deque[int]) -> None:
        """Kill the worker in `slot`, requeue its unfinished items first, and start a fresh worker."""
        old = self._workers[slot]
        todo.extendleft(reversed(old.inflight))
        old.kill()
        self._workers[slot] = _Worker(self.memory_limit_mb)


class StepBudget:
    """A `Verifier` over `verifier` whose verify calls share `seconds` of scoring: one training step's
    (`verifier.step_budget_s`). Each call gets what is left as its deadline; once the budget is spent,
    every answer the integer fast path does not score gets status `deadline` (reward 0) at once, and
    the step's `verifier/deadline` counts them. `seconds=None`: no bound beyond the per-answer timeout.
    Thread-safe: the streaming sampler verifies from a thread of its own."""

    def __init__(self, verifier: Any, seconds: float | None):
        self.verifier = verifier
        self.left = seconds
        self._lock = threading.Lock()

    def verify(self, items: Sequence[tuple[Prompt, str]], within_s: float | None = None) -> list[Verdict]:
        with self._lock:
            if self.left is None:
                return self.verifier.verify(items, within_s)
            limit = self.left if within_s is None else min(self.left, within_s)
            start = time.monotonic()
            try:
                return self.verifier.verify(items, max(0.0, limit))
            finally:
                self.left -= time.monotonic() - start


class _Worker:
    """One verifier process and the parent's end of its socket.

    A plain `python -c` subprocess rather than `multiprocessing`'s spawn/forkserver: both of those
    re-import the caller's `__main__`, which breaks scripts without an `if __name__ == "__main__"`
    guard. A fresh interpreter is as safe with torch's threads as spawn, and `kill()` always works.
    """

    def __init__(self, memory_limit_mb: int | None):
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        code = f"from ada_core.rl.rewards import _worker_main; _worker_main({child_sock.fileno()}, {memory_limit_mb!r})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(child_sock.fileno(),), env=env)
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.started = time.monotonic()
        self.ready = False
        self.inflight: deque[int] = deque()
        self.deadline = math.inf

    def send(self, indices: list[int], jobs: list[tuple[str, str, str, str]], deadline: float) -> bool:
        """Hand the worker a chunk; False if its pipe is broken (the chunk stays in `inflight`)."""
        self.inflight = deque(indices)
        self.deadline = deadline
        try:
            self.conn.send([(i, jobs[i]) for i in indices])
        except OSError:
            return False
        return True

    def drain(self, results: list[Any], timeout_s: float) -> bool:
        """Read every pending message; each result restarts the per-item clock. False if the worker died."""
        try:
            while self.conn.poll():
                msg = self.conn.recv()
                if msg == _READY:
                    self.ready = True
                    continue
                index, result = msg
                results[index] = result
                self.inflight.popleft()
                self.deadline = time.monotonic() + timeout_s
        except (EOFError, OSError):
            return False
        return True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        self.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    """Ask workers to exit, kill any that linger. Runs on close() and at interpreter exit."""
    for w in workers:
        try:
            w.conn.send(None)
        except (OSError, ValueError):
            pass
    for w in workers:
        try:
            w.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        w.kill()
    workers.clear()


# --- worker process ---------------------------------------------------------------------------


def _worker_main(fd: int, memory_limit_mb: int | None) -> None:
    """Loop: receive a chunk of (index, job), send back (index, result) per job; None or EOF ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    conn = Connection(fd)
    if memory_limit_mb:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a runaway bigint raises MemoryError
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" warning is expected
    import math_verify  # noqa: F401  (import cost paid before announcing readiness)

    conn.send(_READY)
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for index, job in chunk:
            conn.send((index, _run_job(job)))


def _run_job(job: tuple[str, str, str, str]) -> Any:
    """One check, with math-verify's own (signal-based) timeouts off: the parent enforces ours.

    `extract_verify` jobs carry a whole (long) completion and its answer format: the extraction
    runs here, under the same per-item timeout as the check.

    math-verify falls back to the raw string when sympy cannot read an answer and then compares
    strings; we keep that (an exact string match still scores 1), but a mismatch where either side
    never became a math object is reported as `parse_error`, not as a wrong answer.
    """
    from math_verify import parse, verify

    kind, gold, answer, fmt = job
    if kind == "extract_verify":
        answer = _extract(fmt, answer)
        if not answer:
            return (0.0, VerifierStatus.PARSE_ERROR.value)
        if _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(gold):
            return (1.0 if int(answer) == int(gold) else 0.0, VerifierStatus.OK.value)
    try:
        gold_parsed = parse(_as_latex(gold), parsing_timeout=None)
        if kind == "parse":
            return _has_math(gold_parsed) and bool(verify(gold_parsed, gold_parsed, timeout_seconds=None))
        answer_parsed = parse(_as_latex(answer), parsing_timeout=None)
        if gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=None):
            return (1.0, VerifierStatus.OK.value)
        readable = _has_math(gold_parsed) and _has_math(answer_parsed)
        return (0.0, VerifierStatus.OK.value if readable else VerifierStatus.PARSE_ERROR.value)
    except Exception:  # noqa: BLE001 - sympy raises anything, including MemoryError/RecursionError
        return False if kind == "parse" else (0.0, VerifierStatus.PARSE_ERROR.value)


def _has_math(parsed: list) -> bool:
    return any(not isinstance(x, str) for x in parsed)


def _as_latex(answer: str) -> str:
    """Wrap a bare answer so math-verify's LaTeX extractor picks it up (`$..$` around it is dropped)."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] == "$":
        answer = answer.strip("$").strip()
    return "\\boxed{" + answer + "}"
