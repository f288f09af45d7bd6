"""Just enough of a PNG reader to judge a screenshot: 8-bit RGB/RGBA, not interlaced.

The report test asks whether a headless browser drew something (not a blank page)
and whether the chart colours are there; an image library would be a dependency for
that alone.  numpy (a trainwatch dependency) does the row filters it can vectorise;
the Average and Paeth filters run per byte, well under a second for a 1200x1600 shot.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # colour type -> bytes per pixel at 8 bits


def _chunks(data: bytes):
    pos = len(SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        yield kind, data[pos + 8:pos + 8 + length]
        pos += 12 + length


def _predicted(kind: int, line: list[int], up: list[int], bpp: int) -> bytes:
    out = bytearray(len(line))
    for x, value in enumerate(line):
        a = out[x - bpp] if x >= bpp else 0
        b = up[x]
        if kind == 3:
            pred = (a + b) >> 1
        else:
            c = up[x - bpp] if x >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        out[x] = (value + pred) & 255
    return bytes(out)


def read_png(path: Path) -> np.ndarray:
    """The pixels as a (height, width, channels) uint8 array."""
    data = Path(path).read_bytes()
    if not data.startswith(SIGNATURE):
        raise ValueError(f"{path}: not a PNG file")
    header, idat = None, []
    for kind, body in _chunks(data):
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    if header is None:
        raise ValueError(f"{path}: no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in CHANNELS or interlace:
        raise ValueError(f"{path}: unsupported PNG (depth {depth}, colour type {colour}, interlace {interlace})")
    bpp = CHANNELS[colour]
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    pixels = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for row in range(height):
        start = row * (stride + 1)
        kind = raw[start]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=start + 1)
        if kind == 0:
            pixels[row] = line
        elif kind == 1:
            pixels[row] = np.cumsum(line.reshape(-1, bpp), axis=0, dtype=np.uint8).reshape(-1)
        elif kind == 2:
            pixels[row] = line + prev
        elif kind in (3, 4):
            pixels[row] = np.frombuffer(_predicted(kind, line.tolist(), prev.tolist(), bpp), dtype=np.uint8)
        else:
            raise ValueError(f"{path}: unknown filter {kind} on row {row}")
        prev = pixels[row]
    return pixels.reshape(height, width, bpp)
