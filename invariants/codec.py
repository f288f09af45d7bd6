"""Bytes <-> batches: the msgpack encoding shared by Kafka messages and trace files.

A Kafka message value is exactly one encoded batch.  A trace file is a short header
followed by *frames*; each frame is ``length (u32 BE) | crc32 (u32 BE) | payload`` where
the payload is the same bytes as a Kafka message value.  Framing with a length and a
checksum is what lets a reader tell the two failure modes apart:

* a last frame cut short (the writer was killed mid-write: fewer bytes than its length
  header announces) is expected after a crash: it is reported as truncation and the
  complete frames before it are still returned;
* a complete frame whose checksum does not match, or an impossible length, is real
  corruption wherever it lies, the last frame included: it raises `TraceCorruption`
  naming the byte offset.  (Skipping a damaged last frame as "torn" would drop the
  step end it holds and report a healthy rank as missing.)

Nothing here opens files: callers hand in a binary stream, so the core stays free of
I/O policy (paths, permissions, directories).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

import msgpack
import msgspec

from .events import Batch, SchemaError, validate_batch


def _extension(code: int, data: memoryview) -> msgpack.ExtType:
    """The contract has no extension types; should one arrive it decodes to the same
    ``msgpack.ExtType`` msgpack would give (timestamps become aware datetimes), so that
    every decoded value can be packed again into window state."""
    return msgpack.ExtType(code, bytes(data))


#: Decoding is the largest per-event cost of every consumer (stream worker, ``check``,
#: ``infer``); msgspec's untyped msgpack decoder builds the same dicts, lists and
#: strings as ``msgpack.unpackb`` about 1.3-1.6x faster (it caches repeated map keys).
_DECODER = msgspec.msgpack.Decoder(ext_hook=_extension)


def _as_plain_type(value: Any) -> Any:
    """msgpack packs a subclass of a plain type as that type (``numpy.float64``, a
    summary's scalar; ``torch.__version__``, a ``str``); msgspec asks.  What neither
    encodes is refused and the recorder's sanitising fallback takes it (msgspec encodes
    a few values msgpack refuses: enum members by value, sets as arrays, datetimes)."""
    for plain in (float, str, int, bytes):
        if isinstance(value, plain):
            return plain(value)
    raise TypeError(f"cannot encode a {type(value).__qualname__}")


#: The producer encodes every batch of every step on the training thread; msgspec's
#: encoder writes the same bytes as ``msgpack.packb(use_bin_type=True)`` about 3x faster.
_ENCODER = msgspec.msgpack.Encoder(enc_hook=_as_plain_type)

TRACE_MAGIC = b"TWTRACE\x01"
TRACE_SUFFIX = ".twtrace"
FRAME_HEADER = struct.Struct(">II")
#: Upper bound for one batch; larger frames are treated as corruption, larger Kafka
#: messages are dead-lettered as oversized.
MAX_BATCH_BYTES = 64 * 1024 * 1024


class TraceCorruption(ValueError):
    """A trace file that is damaged somewhere other than a torn final frame."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


def encode_batch(batch: Batch) -> bytes:
    return _ENCODER.encode(batch)


def decode_bounded(decoder: Any, payload: Any) -> Any:
    """``decoder.decode(payload)``, with nesting too deep to decode as a `SchemaError`.

    The decoders recurse once per nesting level under the interpreter's recursion
    guard (about 1,000 levels; a producer's batches nest fewer than 10), so a small
    hostile message could otherwise escape as a `RecursionError` instead of being
    rejected like any other bad input.  Every msgpack decode of untrusted bytes goes
    through here.
    """
    try:
        return decoder.decode(payload)
    except RecursionError:
        raise SchemaError("too_deep", "batch: values nested too deeply to decode") from None


def decode_batch(payload: bytes, *, max_bytes: int = MAX_BATCH_BYTES) -> Batch:
    """Decode and validate one batch; every failure is a `SchemaError` with a reason."""
    if len(payload) > max_bytes:
        raise SchemaError("oversized", f"batch of {len(payload)} bytes exceeds {max_bytes}")
    try:
        obj: Any = decode_bounded(_DECODER, payload)
    except msgspec.DecodeError as exc:
        raise SchemaError("undecodable", f"not a msgpack batch: {exc}") from None
    except SchemaError:
        raise
    except Exception as exc:  # hostile input may raise other types (e.g. unhashable map keys)
        raise SchemaError("undecodable", f"not a msgpack batch: {type(exc).__name__}: {exc}") from None
    return validate_batch(obj)


def encode_frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass
class FrameScan:
    """What reading a trace stream found besides the good frames."""

    frames: int = 0
    truncated_at: int | None = None  # offset of a torn final frame, if any


def iter_frames(stream: BinaryIO, scan: FrameScan | None = None) -> Iterator[bytes]:
    """Yield frame payloads from a trace stream positioned at its start.

    A final frame cut short ends iteration and is recorded in ``scan.truncated_at``.
    """
    scan = scan if scan is not None else FrameScan()
    magic = stream.read(len(TRACE_MAGIC))
    if magic != TRACE_MAGIC:
        if len(magic) < len(TRACE_MAGIC) and TRACE_MAGIC.startswith(magic):
            scan.truncated_at = 0
            return
        raise TraceCorruption("not a trainwatch trace (bad magic header)", 0)
    offset = len(TRACE_MAGIC)
    while True:
        header = stream.read(FRAME_HEADER.size)
        if not header:
            return
        if len(header) < FRAME_HEADER.size:
            scan.truncated_at = offset
            return
        length, crc = FRAME_HEADER.unpack(header)
        if length > MAX_BATCH_BYTES:
            raise TraceCorruption(f"frame length {length} is impossible", offset)
        payload = stream.read(length)
        if len(payload) < length:
            scan.truncated_at = offset
            return
        if zlib.crc32(payload) != crc:
            raise TraceCorruption("frame checksum mismatch", offset)
        scan.frames += 1
        yield payload
        offset += FRAME_HEADER.size + length
