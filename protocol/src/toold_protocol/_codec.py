"""Encoding and decoding of frames, with decoders built once and reused.

``decode_client_message`` and ``decode_daemon_message`` raise :class:`DecodeFailure`,
which says whether the frame was not MessagePack at all, carried an unknown
``type``, or had a known type with invalid fields, and which request ``id`` it
carried if that much could be read, so the daemon can answer with a typed error.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._errors import ProtocolErrorCode
from ._messages import ClientMessage, DaemonMessage

_encoder = msgspec.msgpack.Encoder()
_client_decoder: msgspec.msgpack.Decoder[ClientMessage] = msgspec.msgpack.Decoder(ClientMessage)
_daemon_decoder: msgspec.msgpack.Decoder[DaemonMessage] = msgspec.msgpack.Decoder(DaemonMessage)


class _Envelope(msgspec.Struct):
    """The least a frame must have: read only to explain a decode failure."""

    type: Any = None
    id: Any = None


_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)


class DecodeFailure(Exception):
    """A frame could not be decoded into a message."""

    def __init__(self, code: ProtocolErrorCode, message: str, request_id: int | None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def encode_value(value: Any) -> bytes:
    """Encode any plain value (used for tool arguments: ``msgspec.Raw(encode_value(args))``)."""
    return _encoder.encode(value)


def decode_client_message(frame: bytes) -> ClientMessage:
    try:
        return _client_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise _explain(frame, exc) from None
    except RecursionError:
        raise _too_deep(frame) from None


def decode_daemon_message(frame: bytes) -> DaemonMessage:
    try:
        return _daemon_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise _explain(frame, exc) from None
    except RecursionError:
        raise _too_deep(frame) from None


def _too_deep(frame: bytes) -> DecodeFailure:
    """A frame nested deeper than the decoder follows: a typed error, never a traceback."""
    try:
        envelope = _envelope_decoder.decode(frame)
        request_id = envelope.id if isinstance(envelope.id, int) and not isinstance(envelope.id, bool) else None
    except (msgspec.DecodeError, RecursionError):
        request_id = None
    return DecodeFailure(ProtocolErrorCode.MALFORMED_FRAME, "frame is nested too deeply", request_id)


def _explain(frame: bytes, exc: msgspec.DecodeError) -> DecodeFailure:
    try:
        envelope = _envelope_decoder.decode(frame)
    except msgspec.DecodeError:
        return DecodeFailure(ProtocolErrorCode.MALFORMED_FRAME, f"frame is not a MessagePack map: {exc}", None)
    request_id = envelope.id if isinstance(envelope.id, int) and not isinstance(envelope.id, bool) else None
    if not isinstance(envelope.type, str):
        return DecodeFailure(ProtocolErrorCode.MALFORMED_FRAME, "frame has no string 'type' field", request_id)
    if "at `$.type`" in str(exc):
        return DecodeFailure(
            ProtocolErrorCode.UNKNOWN_MESSAGE_TYPE, f"unknown message type {envelope.type[:64]!r}", request_id
        )
    return DecodeFailure(
        ProtocolErrorCode.INVALID_MESSAGE, f"invalid {envelope.type[:64]!r} message: {exc}", request_id
    )
