"""Bytes <-> typed values for commands, results and event data: versioned, strict msgpack.

Owns: the wire format of everything the queue puts in the Raft log or returns from it:
    one version byte (CODEC_VERSION), then a msgspec msgpack tagged union (field "t").
Decoding is strict (unknown fields, wrong types, out-of-range values are refused) and is the only
validation a command gets; `decode_command` never raises on bad input, it returns an
`ErrorResult` that the machine returns as the command's result.

Must never: read state, clocks or anything but its argument.
"""

from __future__ import annotations

from typing import Final, cast

import msgspec

from queues.model import Code, ErrorResult, EventValue, QueueCommand, QueueResult

CODEC_VERSION: Final = 1
_VERSION_BYTE: Final = bytes([CODEC_VERSION])

_encoder: Final = msgspec.msgpack.Encoder()
_command_decoder: Final = msgspec.msgpack.Decoder(QueueCommand)
_result_decoder: Final = msgspec.msgpack.Decoder(QueueResult)
_event_data_decoder: Final = msgspec.msgpack.Decoder(dict[str, EventValue])
_headers_decoder: Final = msgspec.msgpack.Decoder(dict[str, str])


def encode_command(command: QueueCommand) -> bytes:
    return _VERSION_BYTE + _encoder.encode(command)


def decode_command(data: bytes) -> QueueCommand | ErrorResult:
    """The command, or the error result to return for it. Never raises on bad bytes."""
    if not data:
        return ErrorResult(code=Code.DECODE_ERROR, detail="empty command")
    if data[0] != CODEC_VERSION:
        return ErrorResult(code=Code.UNSUPPORTED_VERSION, detail=f"codec version {data[0]}")
    try:
        return cast(QueueCommand, _command_decoder.decode(memoryview(data)[1:]))
    except msgspec.ValidationError as error:
        return ErrorResult(code=Code.INVALID, detail=str(error)[:200])
    except msgspec.DecodeError as error:
        return ErrorResult(code=Code.DECODE_ERROR, detail=str(error)[:200])


def encode_result(result: QueueResult) -> bytes:
    return _VERSION_BYTE + _encoder.encode(result)


def decode_result(data: bytes) -> QueueResult:
    """Results come from our own machine: a bad one is a programmer error and raises."""
    if not data or data[0] != CODEC_VERSION:
        raise ValueError(f"not a queue result: {data[:16]!r}")
    return cast(QueueResult, _result_decoder.decode(memoryview(data)[1:]))


def encode_event_data(data: dict[str, EventValue]) -> bytes:
    return _encoder.encode(data)


def decode_event_data(data: bytes) -> dict[str, EventValue]:
    return _event_data_decoder.decode(data)


_sorted_encoder: Final = msgspec.msgpack.Encoder(order="deterministic")
"""Sorts a dict's keys as it encodes them: the bytes of `dict(sorted(headers.items()))` through
`_encoder` (str keys sort by code point, which is their UTF-8 bytes' order), a third of the cost;
every replica encodes every enqueue's headers."""


def encode_headers(headers: dict[str, str]) -> bytes:
    return _sorted_encoder.encode(headers)


def decode_headers(data: bytes) -> dict[str, str]:
    return _headers_decoder.decode(data)
