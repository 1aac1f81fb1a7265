"""The warm path's pieces without a worker process: the ClientApp's routing and message types, the owner-only
directory checks, the socket framing, a worker's answer to a handler that raises, and a silent connection closed
while another client is served (the real processes are in tests/integration/test_warm_worker.py)."""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from pubswap_flwr.node import app as nodeapp
from pubswap_flwr.node.warm import client, framing, worker

# the light ClientApp routes every message type of the protocols' catalog: tests/unit/test_catalog.py


def test_client_app_module_imports_neither_torch_nor_the_protocol_modules():
    code = ("import sys, client_app; print('torch' in sys.modules, any(f'pubswap_flwr.protocols.{m}' in sys.modules "
            "for m in ('base', 'records', 'serving')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.stdout.split() == ["False", "False"]


@pytest.fixture()
def task_identity():
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 11, 3
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _message() -> Message:
    message = Message(RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=11, message_type="train.segment")
    message.metadata.__dict__["_message_id"] = message.object_id
    return message


def _context(node_config: dict, **run_config) -> Context:
    return Context(run_id=7, node_id=11, node_config=node_config, state=RecordDict(), run_config=run_config)


@pytest.mark.parametrize("node_config, run_config, warm", [
    ({"partition-id": 0, "num-partitions": 2}, {}, False),  # simulation: always in process
    ({"partition-id": 0, "num-partitions": 2}, {"deploy.warm-worker": True}, False),
    ({"state-dir": "/tmp/x"}, {"deploy.warm-worker": False}, False),  # deployed, warm path off
    ({"state-dir": "/tmp/x"}, {}, True),  # deployed: warm by default
])
def test_route_sends_deployed_nodes_to_their_worker(monkeypatch, task_identity, node_config, run_config, warm):
    calls = []
    monkeypatch.setattr(nodeapp, "in_process_app", lambda: lambda m, c: calls.append("in-process") or m)

    def fake_call(message, context, *, idle_timeout, task_id):
        calls.append(("worker", idle_timeout, task_id))
        return Message(RecordDict({"reply": ConfigRecord({"ok": True})}), reply_to=message)

    monkeypatch.setattr(client, "call", fake_call)
    message = _message()
    reply = nodeapp.route(message, _context(node_config, **run_config))
    if warm:
        assert calls == [("worker", 900.0, 3)]
        assert reply.metadata.reply_to_message_id == message.metadata.message_id
        assert reply.content["reply"]["ok"] is True
    else:
        assert calls == ["in-process"]


def test_worker_directory_must_be_owner_only(tmp_path, monkeypatch):
    good = tmp_path / "good"
    monkeypatch.setenv(client.RUNTIME_DIR_ENV, str(good))
    assert client.runtime_dir() == good and stat.S_IMODE(good.stat().st_mode) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(client.WorkerError, match="others could reach"):
        client.check_private_dir(open_dir)
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(client.WorkerError, match="not a link"):
        client.check_private_dir(link)
    monkeypatch.setenv(client.RUNTIME_DIR_ENV, str(open_dir))
    with pytest.raises(client.WorkerError, match="chmod 700"):
        client.runtime_dir()


def test_a_socket_path_too_long_for_unix_sockets_is_a_clear_error(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 90)
    monkeypatch.setenv(client.RUNTIME_DIR_ENV, str(deep))
    with pytest.raises(client.WorkerError, match="shorter directory"):
        client.address_for(_context({"state-dir": "/tmp/x"}), watch_pid=1)


def test_worker_address_differs_per_node_config_and_watch_pid(monkeypatch):
    # a short directory: a unix socket path has at most 107 bytes, and pytest-xdist's tmp_path is long
    with tempfile.TemporaryDirectory(prefix="pw") as short:
        monkeypatch.setenv(client.RUNTIME_DIR_ENV, short)
        _addresses_differ()


def _addresses_differ():
    a = client.address_for(_context({"state-dir": "/a"}), 100)
    assert a == client.address_for(_context({"state-dir": "/a"}), 100)
    assert a != client.address_for(_context({"state-dir": "/b"}), 100)
    assert a != client.address_for(_context({"state-dir": "/a"}), 101)


def test_frames_carry_json_messages_and_contexts_and_refuse_the_rest(task_identity):
    left, right = socket.socketpair()
    with left, right:
        framing.send_json(left, {"a": [1, "b"]})
        assert framing.recv_json(right) == {"a": [1, "b"]}
        message, context = _message(), _context({"state-dir": "/s"}, seed=3)
        framing.send_context(left, context)
        framing.send_message(left, message)
        got_context, got = framing.recv_context(right), framing.recv_message(right)
        assert got_context.node_config == {"state-dir": "/s"} and got_context.run_config == {"seed": 3}
        assert got.content["config"]["x"] == 1 and got.metadata.message_type == "train.segment"
        framing.send_frame(left, b"[1, 2]")
        with pytest.raises(framing.FrameError, match="not an object"):
            framing.recv_json(right)
        framing.send_frame(left, b"x" * 64)
        with pytest.raises(framing.FrameError, match="over the 16-byte limit"):
            framing.recv_frame(right, limit=16)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"\0\0\0\0\0\0\0\x09abc")
        a.close()
        with pytest.raises(framing.ConnectionClosed):
            framing.recv_frame(b)


def test_a_handler_that_raises_in_the_worker_is_relayed_as_an_error(task_identity):
    def failing_app(message, context):
        raise ValueError("no such task")

    left, right = socket.socketpair()
    with left, right:
        framing.send_json(left, {"task-id": 3, "idle-timeout": 5.0})
        framing.send_context(left, _context({"state-dir": "/s"}))
        framing.send_message(left, _message())
        assert worker.serve_one(right, failing_app) == 5.0
        assert framing.recv_json(left)["worker"] == framing.PROTOCOL
        answer = framing.recv_json(left)
        assert answer["ok"] is False and "ValueError: no such task" in answer["error"]


def test_the_worker_is_started_with_the_folder_that_holds_the_package_on_its_path():
    # the worker runs `python -m pubswap_flwr.node.warm.worker` with CODE_DIR on PYTHONPATH: it must be the folder
    # holding pubswap_flwr/ (a checkout or an app bundle), wherever the warm client module sits in the package
    assert (client.CODE_DIR / "pubswap_flwr" / "node" / "warm" / "worker.py").is_file()
    assert client.WORKER_MODULE == "pubswap_flwr.node.warm.worker"


def _echo_worker_app(message, context):
    return Message(RecordDict({"reply": ConfigRecord({"node": context.node_id})}), reply_to=message)


@pytest.mark.parametrize("silence", [b"", b"\0\0\0\0\0\0\0\x64" + b'{"task-id"'], ids=["nothing", "a-cut-header"])
def test_warm_worker_silent_connection_is_closed_while_an_honest_client_is_served(task_identity, caplog, silence):
    # The worker serves one connection at a time: a same-user peer that takes the hello and then sends nothing (or
    # part of a frame) held every other ClientApp of the node for REQUEST_SECONDS (60 s) before.
    with tempfile.TemporaryDirectory() as directory:  # short: a unix socket path holds ~100 bytes
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(os.path.join(directory, "w.sock"))
        listener.listen(4)
        stopped: list[str] = []
        serving = threading.Thread(target=lambda: stopped.append(worker.serve(listener, _echo_worker_app,
                                                                              os.getpid(), 30.0)), daemon=True)
        with listener, caplog.at_level(logging.WARNING, logger="pubswap_flwr.node.warm"):
            serving.start()
            silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            honest = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with silent, honest:
                silent.settimeout(20)
                silent.connect(listener.getsockname())
                started = time.monotonic()
                assert framing.recv_json(silent)["worker"] == framing.PROTOCOL  # the worker took it first
                silent.sendall(silence)
                honest.settimeout(20)
                honest.connect(listener.getsockname())
                assert framing.recv_json(honest)["worker"] == framing.PROTOCOL
                framing.send_json(honest, {"task-id": 3, "idle-timeout": 0.5})
                framing.send_context(honest, _context({"state-dir": "/s"}))
                framing.send_message(honest, _message())
                assert framing.recv_json(honest) == {"ok": True}
                assert framing.recv_message(honest).content["reply"]["node"] == 11
                assert time.monotonic() - started < 10  # the silent peer's deadline, not 60 s
                assert silent.recv(1) == b""  # closed by the worker
            serving.join(20)  # idle for the honest request's 0.5 s
        assert stopped == ["idle for 0.5 s"]
    assert f"closed a connection that sent no request header within {worker.HANDSHAKE_SECONDS:g} s" in caplog.text
