"""TensorBoard event files of scalars, written with the standard library only (no TensorFlow, torch or
tensorboardX: tensorboardX imports torch whenever it is installed, seconds on the training path).

An event file is TFRecord framing around serialised `tensorflow.Event` protos: each record is its length (uint64
little-endian), the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data. We write four
Event fields by hand (wall_time 1, step 2, file_version 3, summary 5 of one simple_value, session_log 7 with START,
which makes TensorBoard drop the steps >= it that earlier files logged: a resumed stage's purge).
"""
from __future__ import annotations

import os
import socket
import struct
import time


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord around `data`."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:  # wire type 2: length-delimited
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int, *, file_version: str | None = None, scalar: tuple[str, float] | None = None,
          session_start: bool = False) -> bytes:
    """A serialised Event: `scalar` = (tag, value) as one Summary.Value.simple_value; `session_start`: a SessionLog
    with status START (TensorBoard purges the steps >= `step` logged before it)."""
    if step < 0:
        raise ValueError(f"TensorBoard step must be >= 0, got {step}")
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(int(step))
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalar is not None:
        tag, value = scalar
        summary_value = _bytes_field(1, tag.encode()) + b"\x15" + struct.pack("<f", float(value))
        out += _bytes_field(5, _bytes_field(1, summary_value))
    if session_start:
        out += _bytes_field(7, b"\x08\x01")
    return out


class EventWriter:
    """Scalars to a new event file in `logdir` (`events.out.tfevents.<time>.<host><suffix>`, opened "xb": a name
    in use is an error, never overwritten). `purge_step`: a SessionLog START at it first. Buffered; flushed every
    `flush_secs`, by `flush()` and at `close()`."""

    def __init__(self, logdir: str, filename_suffix: str = "", purge_step: int | None = None,
                 flush_secs: float = 10.0):
        os.makedirs(logdir, exist_ok=True)
        now = time.time()
        self.path = os.path.join(logdir, f"events.out.tfevents.{int(now)}.{socket.gethostname()}{filename_suffix}")
        self._file = open(self.path, "xb")
        self._flush_secs, self._flushed = flush_secs, now
        self._write(event(now, 0, file_version="brain.Event:2"))
        if purge_step is not None:
            self._write(event(now, purge_step, session_start=True))
        self.flush()

    def _write(self, data: bytes) -> None:
        self._file.write(record(data))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        now = time.time()
        self._write(event(now, step, scalar=(tag, value)))
        if now - self._flushed >= self._flush_secs:
            self.flush()

    def flush(self) -> None:
        self._file.flush()
        self._flushed = time.time()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
