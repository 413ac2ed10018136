"""Only a process proven ours is signalled (ada_core/processes.py): `make ui-stop` with a stale
servers.json, and the vLLM launcher's last sweep of its group, each against real processes that took
a recorded pid or are another group's or another user's.

(The vLLM server's own stop, whose launcher a pool may see die hours earlier, is held to the same in
tests/services/test_vllm.py, in a pid namespace where a pid can be handed out on purpose.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

from ada_core.engines.vllm_side import ada_vllm_launch
from ada_core.processes import OwnedGroup, boot_id, identity, is_running, signal_process, start_time

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def stranger():
    """A process that is not ours to stop: it leads a session (so a group) of its own, like a daemon."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


@pytest.fixture()
def bystander():
    """A stranger (a session of its own) that blocks SIGTERM, SIGINT and SIGHUP: one sent to it stays pending,
    where /proc shows it at once (`_never_signalled`), instead of a wait to see whether it dies."""
    code = ("import signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, "
            "signal.SIGHUP}); print(flush=True); sys.stdin.read()")
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)
    process.stdout.readline()  # its signals are blocked from here on
    yield process
    process.kill()
    process.wait()


def _never_signalled(process: subprocess.Popen) -> bool:
    """Whether no SIGTERM, SIGINT, SIGHUP or SIGKILL was ever sent to `process` (a `bystander`): the first three
    stay pending while blocked, and a SIGKILL is pending or has ended it. Read once, no waiting: a signal sent
    by a call that has returned is already there."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{process.pid}/status").read_text().splitlines())
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    sent = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL}
    return process.poll() is None and fields["State"][0] not in "ZX" and not any(pending >> (s - 1) & 1 for s in sent)


def _servers_json(home: Path, pid: int, ident: dict | None) -> Path:
    """A servers.json as `make ui` writes it, naming `pid` for every server and worker."""
    state = {"prefect_url": "http://127.0.0.1:9", "mlflow_url": "http://127.0.0.1:9",
             "pids": {"prefect_server": pid, "mlflow_server": pid, "workers": [pid]}}
    if ident is not None:
        state["started"] = {str(pid): ident}
    path = home / "ui" / "servers.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state))
    return path


@pytest.mark.parametrize("record", ["older start", "before a reboot", "not recorded"])
def test_ui_stop_leaves_alone_a_process_that_has_a_stale_servers_json_pid(bystander, record, infra_ui, tmp_path,
                                                                          capsys):
    """The recorded server died long ago (or the machine rebooted) and its pid now leads someone else's
    group: stopping must not touch it, and must say why."""
    stranger = bystander
    ident = identity(stranger.pid)
    ident = {"older start": {**ident, "start": ident["start"] - 100}, "before a reboot": {**ident, "boot": "another"},
             "not recorded": None}[record]
    state = _servers_json(tmp_path, stranger.pid, ident)
    infra_ui.stop(tmp_path)
    assert _never_signalled(stranger), f"make ui-stop signalled pid {stranger.pid}, which was not its process"
    assert not state.exists()
    said = capsys.readouterr().out
    assert f"prefect_server (pid {stranger.pid}): not " in said, said


def test_ui_stop_run_by_another_user_says_so_in_a_line_and_goes_on(bystander, infra_ui):
    """`make ui-stop` by a user who may not signal the servers (they are root's): one line each, no traceback."""
    stranger = bystander
    home = Path(tempfile.mkdtemp(prefix="ada-ui-home-"))  # pytest's tmp_path sits in a folder only root may enter
    state = _servers_json(home, stranger.pid, identity(stranger.pid))
    for path in (home, state.parent):
        path.chmod(0o777)
    state.chmod(0o666)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the other user: this process, its uid dropped (another interpreter could not be run as it)
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            import contextlib
            import io

            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                infra_ui.stop(home)
            text = out.getvalue()
        except BaseException:  # noqa: BLE001 - what the user would have seen
            text = "TRACEBACK\n" + traceback.format_exc()
        os.write(write_end, text.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as fh:
        said = fh.read()
    os.waitpid(child, 0)
    shutil.rmtree(home)
    assert "TRACEBACK" not in said, said
    assert said.count("not permitted") == 3, said
    assert _never_signalled(stranger)


def test_ui_stop_ends_a_group_it_recorded_and_its_children(infra_ui, tmp_path):
    """The other side: what `make ui` started and recorded is stopped by a `make ui-stop` in another
    process (the launching one is gone), the group's children included."""
    log = tmp_path / "ui" / "server.log"
    leader = infra_ui.spawn(["sh", "-c", "sleep 300 & sleep 300 & wait"], dict(os.environ), log)
    deadline = time.monotonic() + 30
    while len(members := _group(leader.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(members) == 3, members
    state = {"pids": {"prefect_server": leader.pid}}
    infra_ui.record(state, [leader])
    path = tmp_path / "ui" / "servers.json"
    path.write_text(json.dumps(state))
    env = {**os.environ, "ADA_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    stopped = subprocess.run([sys.executable, str(REPO / "infra" / "ui.py"), "stop"], env=env, capture_output=True,
                             text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert f"prefect_server (pid {leader.pid}): stopped" in stopped.stdout, stopped.stdout
    assert leader.wait(timeout=10) == -signal.SIGTERM
    assert not _group(leader.pid), "the group's children outlived make ui-stop"
    infra_ui._STARTED.pop(leader.pid, None)


def test_ui_start_that_fails_stops_a_server_it_had_not_recorded_yet(infra_ui, tmp_path, monkeypatch, free_port):
    """`make ui` on a loaded machine: the Prefect server does not answer within its 120 s, and start fails.
    The server it launched must not be left running (it was not in servers.json yet)."""
    launched = []

    def no_answer(url, timeout_s, proc=None, log=None):
        launched.append(proc)
        raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s")

    monkeypatch.setattr(infra_ui.ui_servers, "wait_http", no_answer)  # where start_prefect_server looks it up
    monkeypatch.setenv("ADA_PREFECT_PORT", str(free_port()))
    monkeypatch.setenv("ADA_MLFLOW_PORT", str(free_port()))
    with pytest.raises(TimeoutError):
        infra_ui.start(tmp_path)
    [server] = launched
    assert server.poll() is not None, f"the Prefect server (pid {server.pid}) was left running"
    assert not _group(server.pid) and server.pid not in infra_ui._STARTED


def _group(pgid: int) -> list[int]:
    from ada_core.processes import group_members

    return sorted(group_members(pgid))


def test_a_signal_reaches_a_pid_only_while_it_is_the_process_recorded(stranger):
    start = start_time(stranger.pid)
    assert is_running({"pid": stranger.pid, "start": start, "boot": boot_id()})
    assert not is_running({"pid": stranger.pid, "start": start, "boot": "another"})
    assert not signal_process(stranger.pid, start - 1, signal.SIGTERM)
    assert stranger.poll() is None
    assert signal_process(stranger.pid, start, signal.SIGTERM)
    assert stranger.wait(timeout=10) == -signal.SIGTERM
    assert not signal_process(stranger.pid, start, signal.SIGTERM)  # a zombie reaped: nobody's pid now


def test_an_owned_group_is_ours_only_while_a_known_process_is_in_it(stranger):
    """A group proven ours through its leader; once nothing of it is left, its number proves nothing."""
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    group = OwnedGroup(leader.pid, start_time(leader.pid))
    deadline = time.monotonic() + 30
    while len(group.known) < 2 and time.monotonic() < deadline:
        assert group.refresh()
        time.sleep(0.05)
    assert len(group.live()) == 2
    assert group.signal(signal.SIGKILL) == 2
    leader.wait(timeout=10)
    deadline = time.monotonic() + 30
    while group.refresh() and time.monotonic() < deadline:  # until the orphaned child's zombie is reaped too
        time.sleep(0.05)
    assert not group.refresh() and not group.live()
    assert OwnedGroup(stranger.pid, start_time(stranger.pid) + 1).signal(signal.SIGKILL) == 0
    assert stranger.poll() is None


def test_the_vllm_launcher_kills_members_of_its_own_group_only(stranger):
    """The launcher's last sweep lists its group, then kills each member through a pidfd, checking the
    group again: a pid that left the group (ended, given to another process) is spared."""
    member = subprocess.Popen(["sleep", "300"])  # in this process's group, as the server is in the launcher's
    try:
        ada_vllm_launch.kill_member(stranger.pid)
        ada_vllm_launch.kill_member(member.pid)
        assert member.wait(timeout=10) == -signal.SIGKILL
        assert stranger.poll() is None
    finally:
        member.kill()
        member.wait()
