"""What the ext_proc port costs per message in a way the machine's load cannot move: Python bytecodes.

In process, deterministic input: ext_proc streams shaped as `bench_ext_proc.py`'s (3 messages each,
its two captured request shapes, a DATA frame per message, 32 streams in flight, each read holding
one message of every stream), written by the `h2` client library and fed to one `epp.h2` connection
with the real `ExtProcServicer`; replies go to a transport that drops them. Counts the bytecodes
executed (``sys.settrace`` opcode events) per message, split into the h2 layer, the rest of `epp`,
and everything else; and, for context, the CPU time per message (min of 7 runs, load-sensitive).
Run it on two checkouts to compare them (`PYTHONPATH` picks the `epp` measured):

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_h2_bytecodes.py [--requests 320]
    cd /tmp/other && PYTHONPATH=$PWD /path/to/.venv/bin/python /path/to/bench_h2_bytecodes.py

Uses one private hook, ``GrpcServer._new_connection`` (there since the server was written).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import struct
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import h2.config
import h2.connection
import h2.settings
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ext_proc

from epp.config import SchedulerConfig
from epp.h2 import GrpcServer
from epp.handlers import ExtProcServicer
from epp.metrics import RequestMetrics
from epp.scheduling import Scheduler

IN_FLIGHT = 32


class _Drop:
    """A transport that takes everything and never pushes back."""

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">HBBBI", len(payload) >> 8, len(payload) & 0xFF, kind, 0, 0) + payload


def reads(requests: int) -> list[bytes]:
    """The client's bytes, one entry per read the server gets."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    client.increment_flow_control_window(2**31 - 1 - 65_535)
    # The server's credit, as if read: windows the generator never runs out of.
    client.receive_data(
        _frame(0x4, struct.pack(">HI", 0x4, 2**31 - 1)) + _frame(0x8, struct.pack(">I", 2**31 - 65_536))
    )
    shapes = bench_ext_proc.captured_requests()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", bench_ext_proc.METHOD),
        (":authority", "epp"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", "10S"),
    ]
    out = [client.data_to_send()]
    for first in range(0, requests, IN_FLIGHT):
        streams = []
        for n in range(first, first + IN_FLIGHT):
            stream_id = client.get_next_available_stream_id()
            client.send_headers(stream_id, headers)
            streams.append((stream_id, shapes[n % len(shapes)]))
        for step in range(3):
            for stream_id, messages in streams:
                message = messages[step]
                client.send_data(stream_id, len(message).to_bytes(5, "big") + message, end_stream=step == 2)
            out.append(client.data_to_send())
    return out


def _servicer() -> ExtProcServicer:
    frozen = time.monotonic()
    rng = random.Random(2)
    return ExtProcServicer(
        bench_ext_proc._seeded_store(frozen),
        Scheduler(SchedulerConfig(), rng, lambda: frozen),
        RequestMetrics(CollectorRegistry()),
        destination_header_key="x-gateway-destination-endpoint",
        metadata_namespace="envoy.lb",
        rng=rng,
        clock=lambda: frozen,
    )


def _feed(data: list[bytes], trace: Any = None) -> float:
    server = GrpcServer()
    _servicer().add_to_h2_server(server)
    connection = server._new_connection()
    connection.connection_made(_Drop())  # type: ignore[arg-type]
    started = time.process_time()
    sys.settrace(trace)
    try:
        for chunk in data:
            connection.data_received(chunk)
    finally:
        sys.settrace(None)
    spent = time.process_time() - started
    assert connection.open_streams == 0, f"{connection.open_streams} streams left open"
    connection.connection_lost(None)
    return spent


async def run(requests: int) -> None:
    data = reads(requests)
    messages = 3 * requests
    _feed(data)  # warm up: first-call caches, header blocks seen once
    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        part = "epp.h2" if "/epp/h2/" in name else "epp (rest)" if "/epp/" in name else "other"
        frame.f_trace_opcodes = True

        def opcodes(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[part] += 1
            return opcodes

        return opcodes

    _feed(data, tracer)
    for part in ("epp.h2", "epp (rest)", "other"):
        print(f"bytecodes per message  {part:11} {counts[part] / messages:8.1f}")
    print(f"bytecodes per message  {'total':11} {sum(counts.values()) / messages:8.1f}")
    best = min(_feed(data) for _ in range(7))
    print(f"CPU per message        {best / messages * 1e6:.1f} µs (min of 7 runs of {requests} requests)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=320, help="a multiple of 32")
    args = parser.parse_args()
    asyncio.run(run(args.requests))


if __name__ == "__main__":
    main()
