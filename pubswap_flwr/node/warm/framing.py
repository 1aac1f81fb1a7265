"""The bytes between a ClientApp and its node's warm worker: length-prefixed frames over a unix stream socket.

A frame is an 8-byte big-endian length and that many bytes. A conversation:

    worker → client   hello    JSON {"worker": PROTOCOL, "pid": ...}   (sent when the worker takes the connection)
    client → worker   request  JSON {"task-id": ..., "idle-timeout": ...}, then the Context and the Message as
                               Flower's own protobuf (`context_to_proto`, `message_to_proto`)
    worker → client   reply    JSON {"ok": true} and the reply Message as protobuf, or {"ok": false, "error": text}

JSON and protobuf only: nothing read from the socket is ever unpickled or evaluated.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from flwr.app import Context, Message
from flwr.common.serde import context_from_proto, context_to_proto, message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Context as ProtoContext  # pylint: disable=no-name-in-module
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module
from google.protobuf.message import DecodeError

PROTOCOL = 1
MAX_FRAME = 2**31 - 1  # protobuf's own limit on one message
MAX_JSON_FRAME = 1 << 20
_LENGTH = struct.Struct(">Q")


class ConnectionClosed(ConnectionError):
    """The other side closed the socket (or died) before a whole frame arrived."""


class FrameError(ValueError):
    """A frame that is not what the conversation expects (too long, not a JSON object, wrong protocol)."""


class FrameTimeout(FrameError):
    """The peer did not send a whole frame before the deadline (it went silent, or trickles)."""


def _recv_exact(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    """`size` bytes; with a `deadline` (time.monotonic()) all of them by then, or FrameTimeout."""
    chunks, left = [], size
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FrameTimeout(f"{left} of {size} bytes had not come by the deadline")
            sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(left, 1 << 20))
        except TimeoutError:
            raise FrameTimeout(f"{left} of {size} bytes had not come by the deadline") from None
        if not chunk:
            raise ConnectionClosed(f"the peer closed the connection with {left} of {size} bytes still to come")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_frame(sock: socket.socket, data: bytes) -> None:
    if len(data) > MAX_FRAME:
        raise FrameError(f"a frame of {len(data)} bytes is over the {MAX_FRAME}-byte limit")
    sock.sendall(_LENGTH.pack(len(data)) + data)


def recv_frame(sock: socket.socket, limit: int = MAX_FRAME, deadline: float | None = None) -> bytes:
    (size,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size, deadline))
    if size > limit:
        raise FrameError(f"a frame of {size} bytes is over the {limit}-byte limit")
    return _recv_exact(sock, size, deadline)


def send_json(sock: socket.socket, value: dict[str, Any]) -> None:
    send_frame(sock, json.dumps(value).encode())


def recv_json(sock: socket.socket, deadline: float | None = None) -> dict[str, Any]:
    data = recv_frame(sock, MAX_JSON_FRAME, deadline)
    try:
        value = json.loads(data)
    except ValueError as err:
        raise FrameError(f"a header frame is not JSON: {err}") from None
    except RecursionError:
        raise FrameError("a header frame is JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise FrameError(f"a header frame is a JSON {type(value).__name__}, not an object")
    return value


def send_message(sock: socket.socket, message: Message) -> None:
    send_frame(sock, message_to_proto(message).SerializeToString())


def _from_proto(data: bytes, proto_type, convert, what: str):
    """Flower's own decoding of a frame; bytes that are not one of its `what`s are a FrameError. Protobuf parses
    many byte strings as some message, and Flower's conversion then raises ValueError, TypeError (its
    MessageInitializationError too) or AttributeError on the fields it finds missing or malformed."""
    try:
        return convert(proto_type.FromString(data))
    except (DecodeError, ValueError, TypeError, AttributeError) as err:
        raise FrameError(f"a {what} frame is not a Flower {what} ({type(err).__name__}: {str(err)[:200]})") from None


def recv_message(sock: socket.socket, deadline: float | None = None) -> Message:
    return _from_proto(recv_frame(sock, deadline=deadline), ProtoMessage, message_from_proto, "message")


def send_context(sock: socket.socket, context: Context) -> None:
    send_frame(sock, context_to_proto(context).SerializeToString())


def recv_context(sock: socket.socket, deadline: float | None = None) -> Context:
    return _from_proto(recv_frame(sock, deadline=deadline), ProtoContext, context_from_proto, "context")
