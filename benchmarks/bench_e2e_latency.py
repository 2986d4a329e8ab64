"""What an EPP adds on the data path, ours and others side by side in one run.

All paths go to the same simulated vLLM pod:
- ``client -> simulator``: no Envoy at all (context only);
- ``Envoy -> simulator``: an Envoy without the ext_proc filter and a STATIC upstream
  (``EnvoyOptions(direct_upstream=...)``): the baseline every EPP's added latency is measured from;
- ``Envoy + EPP -> simulator``: our EPP process behind its Envoy, exactly as ``harness.beds.stack.Stack``
  runs it (control plane, pool, model, pod; ext_proc over verified TLS);
- one more path per ``--compare-*`` option: another EPP command line (``harness.subject.foreign_epp``),
  watching the same pool, behind an Envoy of its own in the body mode that EPP speaks
  (``EppCommand.envoy_request_body_mode``): BUFFERED by default (DESIGN.md §2; request headers SEND,
  body BUFFERED, response SKIP), as upstream v0.3.0's default server expects;
  FULL_DUPLEX_STREAMED (one round trip per request) with ``--compare-ours-full-duplex`` or
  ``--compare-upstream-streaming``.

The simulator is a pod the node agent runs (its own process) with a tiny ``time_scale`` and enough
slots never to be the bottleneck. Latency at 1 request in flight comes from aiohttp in this process
(p50/p99; an EPP's added latency is the difference to the direct Envoy); throughput at 32 in flight
from nghttp2's h2load (`load_h2load`; ``--load-generator aiohttp`` for this process's client, which
on 2 cores takes as much CPU per request as the EPPs it compares). Rounds alternate the order of the
paths so drift hits all alike. CPU per request is read from /proc (user + system time of the EPP
process, all its threads, of its Envoy and of the simulator) and from the client's own usage over
each measurement, and printed per process; RSS at the end. Prints figures, asserts nothing.
Targets (issue 13): ours ≤ upstream on added latency, ≥ on requests/s at 32 in flight.

    .venv/bin/python benchmarks/bench_e2e_latency.py                      # ours only
    .venv/bin/python benchmarks/bench_e2e_latency.py --compare-upstream   # + upstream v0.3.0 (built
                                                  # first: harness build --upstream-epp v0.3.0)
    .venv/bin/python benchmarks/bench_e2e_latency.py --compare-epp-command "/opt/my-epp -flag=x"
    .venv/bin/python benchmarks/bench_e2e_latency.py --compare-ours-tree /tmp/epp-main  # another checkout
    .venv/bin/python benchmarks/bench_e2e_latency.py --compare-ours-full-duplex  # ours in full duplex too
    .venv/bin/python benchmarks/bench_e2e_latency.py --compare-ours-v1  # ours behind upstream's v1 Envoy
    # Today's EPPs side by side on v1 CRDs, each behind the request side of the v1 mode
    # (FULL_DUPLEX_STREAMED); ours in that mode too (`harness build --upstream-epp v1.5.0` and
    # `harness build --epp-source` first):
    EPP_HARNESS_CRD_RELEASE=v1.5.0 .venv/bin/python benchmarks/bench_e2e_latency.py \
        --compare-ours-full-duplex --compare-upstream v1.5.0 \
        --compare-epp-command "$LLM_D_EPP" --compare-epp-fixed-ports ""
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import resource
import shlex
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import load_h2load  # beside this file

from harness.beds.stack import BASE_MODEL, ModelSpec, Stack, StackOptions
from harness.cluster import source_build
from harness.cluster.controlplane import ControlPlane
from harness.dataplane.envoy import Envoy, EnvoyOptions
from harness.sim import SimConfig
from harness.subject.foreign_epp import EppCommand, ForeignEpp, sim_metric_args

NAMESPACE = "bench"
POOL = "bench-pool"
POD = "bench-0"
SIM_PORT = 8000
MODEL = BASE_MODEL
BODY = b'{"model": "%s", "prompt": "Say hi.", "max_tokens": 1}' % MODEL.encode()
HEADERS = {"Content-Type": "application/json"}
HIGH_CONCURRENCY = 32
# The client of the throughput runs: nghttp2's h2load (C, a few tens of µs of CPU per request) or this
# process's aiohttp (several hundred µs: on 2 cores it takes CPU from the path it measures).
H2LOAD, AIOHTTP = "h2load", "aiohttp"
# The ext_proc cluster of the direct Envoy is defined but never called.
UNUSED_EXT_PROC = "127.0.0.1:9"
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of process ``pid`` (every thread), from /proc; 0 when it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15)


def memory_mib(pid: int | None) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    values = {"VmRSS": 0.0, "VmHWM": 0.0}
    if pid is None:
        return values["VmRSS"], values["VmHWM"]
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in values:
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


@dataclass
class Path_:
    """One way to the simulator: its URL, a label, and the processes whose CPU it costs."""

    url: str
    label: str
    epp_pid: int | None = None
    envoy_pid: int | None = None
    is_epp: bool = False
    sim_pid: int | None = None
    ours: bool = False  # our EPP (any set-up)
    full_duplex: bool = False  # its Envoy sends the request body FULL_DUPLEX_STREAMED


@dataclass
class PathStats:
    latencies_s: list[float] = field(default_factory=list)
    c1_errors: int = 0
    c32_requests: int = 0
    c32_errors: int = 0
    c32_seconds: float = 0.0
    # CPU seconds spent while measuring, per phase: EPP, Envoy, the load generator, the simulator
    c1_cpu: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    c32_cpu: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    rss_mib: float = 0.0
    hwm_mib: float = 0.0

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        if not ordered:
            return float("nan")
        index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
        return 1000 * ordered[index]

    @property
    def throughput(self) -> float:
        return self.c32_requests / self.c32_seconds if self.c32_seconds else 0.0

    def cpu_us_per_request(self, phase: str, which: int) -> float:
        cpu = self.c1_cpu if phase == "c1" else self.c32_cpu
        count = (
            len(self.latencies_s) + self.c1_errors if phase == "c1" else self.c32_requests + self.c32_errors
        )
        return 1e6 * cpu[which] / count if count else float("nan")


EPP, ENVOY, CLIENT, SIM = range(4)  # indexes of PathStats.c1_cpu / c32_cpu


def own_cpu_seconds() -> float:
    """This process's CPU time: the aiohttp load generator's (with the little else it runs)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def cpu_meter(path: Path_, into: list[float]) -> Iterator[None]:
    """Adds the EPP's, Envoy's, this process's and the simulator's CPU over the block to ``into``
    (a load generator in a child process adds its own, see `measure_throughput`)."""
    pids = (path.epp_pid, path.envoy_pid)
    before = [cpu_seconds(pid) for pid in pids]
    own, sim = own_cpu_seconds(), cpu_seconds(path.sim_pid)
    yield
    for index, pid in enumerate(pids):
        into[index] += cpu_seconds(pid) - before[index]
    into[CLIENT] += own_cpu_seconds() - own
    into[SIM] += cpu_seconds(path.sim_pid) - sim


async def one(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.post(url, data=BODY, headers=HEADERS) as response:
        await response.read()
        return response.status == 200


async def measure_c1(url: str, count: int, deadline_s: float, stats: PathStats) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        ends = time.monotonic() + deadline_s
        for _ in range(count):
            began = time.perf_counter()
            ok = await one(session, url)
            elapsed = time.perf_counter() - began
            if ok:
                stats.latencies_s.append(elapsed)
            else:
                stats.c1_errors += 1
            if time.monotonic() > ends:
                break


async def measure_throughput_h2load(url: str, count: int, stats: PathStats) -> None:
    """As `measure_throughput`, with h2load as the client (`load_h2load`): its CPU is the client's."""
    done = await load_h2load.run(load_h2load.ensure_h2load(), url, BODY, HEADERS, HIGH_CONCURRENCY, count)
    stats.c32_seconds += done.seconds
    stats.c32_requests += done.ok
    stats.c32_errors += done.failed
    stats.c32_cpu[CLIENT] += done.client_cpu_s


async def measure_throughput(url: str, count: int, deadline_s: float, stats: PathStats) -> None:
    remaining = count
    done = errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=HIGH_CONCURRENCY)) as session:
        ends = time.monotonic() + deadline_s

        async def worker() -> None:
            nonlocal remaining, done, errors
            while remaining > 0 and time.monotonic() < ends:
                remaining -= 1
                ok = await one(session, url)
                done += 1
                errors += 0 if ok else 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(HIGH_CONCURRENCY)))
        stats.c32_seconds += time.perf_counter() - began
    stats.c32_requests += done - errors
    stats.c32_errors += errors


async def warm_up(url: str, count: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as session:
        await asyncio.gather(*(one(session, url) for _ in range(count)))


async def run_rounds(paths: dict[str, Path_], args: argparse.Namespace) -> dict[str, PathStats]:
    stats = {name: PathStats() for name in paths}
    for path in paths.values():
        await warm_up(path.url, args.warmup)
    names = list(paths)
    for round_index in range(args.rounds):
        # Rotate (not only reverse) so that with several EPPs none is always first or last.
        shift = round_index % len(names)
        order = names[shift:] + names[:shift]
        if round_index % 2:
            order.reverse()
        for name in order:
            with cpu_meter(paths[name], stats[name].c1_cpu):
                await measure_c1(
                    paths[name].url, args.c1_requests // args.rounds, args.max_seconds, stats[name]
                )
        for name in order:
            count = args.c32_requests // args.rounds
            with cpu_meter(paths[name], stats[name].c32_cpu):
                if args.load_generator == H2LOAD:
                    await measure_throughput_h2load(paths[name].url, count, stats[name])
                else:
                    await measure_throughput(paths[name].url, count, args.max_seconds, stats[name])
    for name, path in paths.items():
        stats[name].rss_mib, stats[name].hwm_mib = memory_mib(path.epp_pid)
    return stats


def report(stats: dict[str, PathStats], paths: dict[str, Path_]) -> None:
    labels = {name: path.label for name, path in paths.items()}
    width = max(len(label) for label in labels.values()) + 2
    direct = stats["direct"]
    print(
        f"\n{'Latency at 1 request in flight (ms)':<{width + 2}}"
        f"{'p50':>7} {'p99':>7} {'mean':>7} {'+p50':>7} {'+p99':>7} {'n':>6} {'errors':>7}"
    )
    for name, s in stats.items():
        mean = 1000 * statistics.fmean(s.latencies_s) if s.latencies_s else float("nan")
        added = ""
        if paths[name].is_epp:
            added = (
                f"{s.percentile_ms(50) - direct.percentile_ms(50):+7.2f} "
                f"{s.percentile_ms(99) - direct.percentile_ms(99):+7.2f}"
            )
        else:
            added = f"{'':>7} {'':>7}"
        print(
            f"  {labels[name]:<{width}}{s.percentile_ms(50):7.2f} {s.percentile_ms(99):7.2f} {mean:7.2f} "
            f"{added} {len(s.latencies_s):6d} {s.c1_errors:7d}"
        )
    print("  (+p50, +p99: added to the Envoy-only path by ext_proc and the EPP)")
    print(
        f"\n{f'Throughput at {HIGH_CONCURRENCY} in flight':<{width + 2}}"
        f"{'req/s':>10} {'vs direct':>10} {'n':>7} {'errors':>7}"
    )
    for name, s in stats.items():
        ratio = s.throughput / direct.throughput if direct.throughput else float("nan")
        print(
            f"  {labels[name]:<{width}}{s.throughput:10.0f} {ratio:10.2f} "
            f"{s.c32_requests:7d} {s.c32_errors:7d}"
        )
    epps = [name for name in stats if paths[name].is_epp]
    print(
        f"\n{'CPU per request (µs) and memory':<{width + 2}}"
        f"{'EPP c1':>8} {'EPP c32':>8} {'Envoy c1':>9} {'Envoy c32':>10} {'EPP RSS':>9} {'peak':>7}"
    )
    for name in epps:
        s = stats[name]
        print(
            f"  {labels[name]:<{width}}"
            f"{s.cpu_us_per_request('c1', 0):8.0f} {s.cpu_us_per_request('c32', 0):8.0f} "
            f"{s.cpu_us_per_request('c1', 1):9.0f} {s.cpu_us_per_request('c32', 1):10.0f} "
            f"{s.rss_mib:7.1f}Mi {s.hwm_mib:5.1f}Mi"
        )
    print(
        f"\n{f'CPU per request at {HIGH_CONCURRENCY} in flight, by process (µs)':<{width + 2}}"
        f"{'EPP':>7} {'Envoy':>7} {'client':>7} {'sim':>7} {'total':>7}"
    )
    for name, s in stats.items():
        parts = [s.cpu_us_per_request("c32", which) for which in (EPP, ENVOY, CLIENT, SIM)]
        row = " ".join(f"{part:7.0f}" for part in parts)
        print(f"  {labels[name]:<{width}}{row} {sum(parts):7.0f}")
    print("  (client: the load generator; on a 2-core box these share the same two cores)")
    # Ours against every other EPP: in its default BUFFERED set-up, and in full duplex when measured
    # (`--compare-ours-full-duplex`: the set-up today's EPPs run in).
    ours_full_duplex = [name for name in epps if paths[name].ours and paths[name].full_duplex]
    for ours_name in ("epp", *ours_full_duplex):
        compare(stats, paths, ours_name, [name for name in epps if not paths[name].ours])


def compare(stats: dict[str, PathStats], paths: dict[str, Path_], ours_name: str, others: list[str]) -> None:
    """One line per other EPP: added p50 and p99, and req/s at 32 in flight, against ours."""
    labels = {name: path.label for name, path in paths.items()}
    direct, ours = stats["direct"], stats[ours_name]
    for name in others:
        other = stats[name]
        ours_p50 = ours.percentile_ms(50) - direct.percentile_ms(50)
        other_p50 = other.percentile_ms(50) - direct.percentile_ms(50)
        ours_p99 = ours.percentile_ms(99) - direct.percentile_ms(99)
        other_p99 = other.percentile_ms(99) - direct.percentile_ms(99)
        ratio = ours.throughput / other.throughput if other.throughput else float("nan")
        print(
            f"\n{labels[ours_name]} vs {labels[name]}: added p50 {ours_p50:+.2f} vs {other_p50:+.2f} ms "
            f"({'holds' if ours_p50 <= other_p50 else 'misses'}: ours <= theirs), "
            f"added p99 {ours_p99:+.2f} vs {other_p99:+.2f} ms "
            f"({'holds' if ours_p99 <= other_p99 else 'misses'}), "
            f"req/s at {HIGH_CONCURRENCY} {ours.throughput:.0f} vs {other.throughput:.0f} = {ratio:.2f}x "
            f"({'holds' if ratio >= 1 else 'misses'}: >= 1; "
            f"{'holds' if ratio >= 1.2 else 'misses'}: >= 1.2), "
            f"EPP CPU/request at {HIGH_CONCURRENCY} {ours.cpu_us_per_request('c32', EPP):.0f} vs "
            f"{other.cpu_us_per_request('c32', EPP):.0f} µs"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--c1-requests", type=int, default=1000, help="sequential requests per path")
    parser.add_argument("--c32-requests", type=int, default=3000, help="requests per path at 32 in flight")
    parser.add_argument("--warmup", type=int, default=200, help="requests per path before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds the counts are split over")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="cap of one measurement of one path")
    parser.add_argument("--time-scale", type=float, default=0.001, help="simulator time scale")
    parser.add_argument(
        "--compare-epp-command",
        action="append",
        default=[],
        metavar="CMD",
        help="also measure this EPP command line (repeatable); its flag dialect is read off its --help "
        "(v0.3 camelCase, v1.x kebab-case, lwepp) as `harness conformance --epp-command` reads it",
    )
    parser.add_argument(
        "--compare-epp-fixed-ports",
        default=None,
        metavar="PORTS",
        help="ports every --compare-epp-command binds whatever its flags (default: controller-runtime's "
        '8080, as upstream v0.3.0; "" for none, e.g. llm-d-router)',
    )
    parser.add_argument(
        "--compare-upstream",
        nargs="?",
        const="0.3.0",
        metavar="VERSION",
        help="also measure upstream's Go EPP (default v0.3.0; `harness build --upstream-epp v0.3.0` first)",
    )
    parser.add_argument(
        "--compare-upstream-streaming",
        nargs="?",
        const="0.3.0",
        metavar="VERSION",
        help="also measure upstream's Go EPP as its v0.3.0 manifests deploy it: USE_STREAMING=true "
        "behind an Envoy in FULL_DUPLEX_STREAMED mode (not with --compare-upstream: both bind :8080)",
    )
    parser.add_argument(
        "--compare-ours-command",
        action="append",
        default=[],
        metavar="CMD",
        help="also measure this command line of our EPP (our flags too), e.g. "
        '"python -m epp --extProcTransport=grpcio" (repeatable)',
    )
    parser.add_argument(
        "--compare-ours-full-duplex",
        action="store_true",
        help="also measure our EPP behind an Envoy in FULL_DUPLEX_STREAMED mode (one round trip per request)",
    )
    parser.add_argument(
        "--compare-ours-v1",
        action="store_true",
        help="also measure our EPP behind an Envoy in the v1 mode of upstream's test envoy.yaml "
        "(EnvoyOptions.v1: both bodies FULL_DUPLEX_STREAMED, response headers and trailers SEND)",
    )
    parser.add_argument(
        "--compare-ours-tree",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="also measure our EPP from another checkout (e.g. `git worktree add /tmp/epp-main main`), "
        "behind a BUFFERED Envoy (repeatable)",
    )
    parser.add_argument(
        "--fixed-port-wait",
        type=float,
        default=900.0,
        metavar="S",
        help="how long a compared EPP with a fixed port (upstream v0.3.0: :8080) waits for another "
        "harness process on this host to release it",
    )
    parser.add_argument("--no-sim-path", action="store_true", help="skip the client -> simulator path")
    parser.add_argument(
        "--load-generator",
        choices=(H2LOAD, AIOHTTP),
        default=H2LOAD,
        help="the client of the throughput runs: h2load (nghttp2-client, installed when missing; the "
        "default: it leaves the CPU to the path) or this process's aiohttp (the figures before Dec 2026)",
    )
    return parser.parse_args(argv)


def short_label(command_line: str) -> str:
    """A command line as a row label: program names without their directories; a binary of
    `harness build --epp-source` by its module and revision (its file is always `epp`)."""
    return " ".join(_short_word(word) for word in shlex.split(command_line))


def _short_word(word: str) -> str:
    if "/" not in word or word.startswith("-"):
        return word
    path = Path(word)
    parts = path.parts
    if source_build.CACHE_DIR in parts[:-3]:
        module, revision = parts[-3], parts[-2]
        return f"{module.replace('+', '/')} {revision}"
    return path.name


def compared_commands(args: argparse.Namespace) -> list[tuple[EppCommand, EnvoyOptions]]:
    """Each other EPP and the Envoy options it runs behind (the body mode its dialect speaks)."""
    commands: list[EppCommand] = []
    v1: list[tuple[EppCommand, EnvoyOptions]] = []
    if args.compare_ours_v1:
        v1.append(
            (
                dataclasses.replace(EppCommand.ours(), label="epp (ours) v1"),
                EnvoyOptions.v1(log_level="warning"),
            )
        )
    if args.compare_upstream:
        commands.append(EppCommand.upstream(args.compare_upstream))
    if args.compare_upstream_streaming:
        plain = EppCommand.upstream(args.compare_upstream_streaming)
        commands.append(
            dataclasses.replace(
                plain,
                argv=("env", "USE_STREAMING=true", *plain.argv),
                label=f"{plain.name} streaming",
                request_body_mode="FULL_DUPLEX_STREAMED",
            )
        )
    commands += [
        dataclasses.replace(
            EppCommand.from_text(line, fixed_ports=args.compare_epp_fixed_ports), label=short_label(line)
        )
        for line in args.compare_epp_command
    ]
    # Our EPP from another command line or checkout: our flags, told the pool group as `ours()` is.
    for line in args.compare_ours_command:
        argv = tuple(shlex.split(line))
        commands.append(dataclasses.replace(EppCommand.ours(), argv=argv, label=short_label(line)))
    if args.compare_ours_full_duplex:
        commands.append(
            dataclasses.replace(
                EppCommand.ours(), label="epp (ours) full duplex", request_body_mode="FULL_DUPLEX_STREAMED"
            )
        )
    for tree in args.compare_ours_tree:
        tree = tree.resolve()
        argv = ("env", f"PYTHONPATH={tree}", sys.executable, "-m", "epp")
        commands.append(dataclasses.replace(EppCommand.ours(), argv=argv, label=f"epp at {tree.name}"))
    # Each behind the Envoy the harness gives it (`EppCommand.envoy_options`): BUFFERED for v0.3's
    # dialect, the request side of the v1 mode (FULL_DUPLEX_STREAMED, trailers) for a v1.x EPP.
    return [
        *((command, command.envoy_options(EnvoyOptions(log_level="warning"))) for command in commands),
        *v1,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    compared = compared_commands(args)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (others' work counts too)")
    with ControlPlane() as plane, contextlib.ExitStack() as stack_of:
        options = StackOptions(
            namespace=NAMESPACE,
            pool_name=POOL,
            pods=0,
            models=(ModelSpec("bench", MODEL, "Critical"),),
            envoy=EnvoyOptions(log_level="warning"),
        )
        stack = stack_of.enter_context(Stack(plane.access, options))
        assert stack.cluster is not None
        assert stack.envoy is not None
        assert stack.epp is not None
        sim = SimConfig(model=MODEL, max_num_seqs=256, time_scale=args.time_scale)
        ip = stack.cluster.add_pod(POD, {"app": POOL}, sim_config=sim, ports=(SIM_PORT,)).ip
        stack.wait_pods_scraped(1)
        sim_pid = stack.cluster.sim(POD).pid
        direct_options = EnvoyOptions(log_level="warning", direct_upstream=f"{ip}:{SIM_PORT}")
        direct = stack_of.enter_context(Envoy(UNUSED_EXT_PROC, options=direct_options))
        paths: dict[str, Path_] = {}
        if not args.no_sim_path:
            paths["sim"] = Path_(
                f"http://{ip}:{SIM_PORT}/v1/completions", "client -> simulator (no Envoy)", sim_pid=sim_pid
            )
        paths["direct"] = Path_(
            f"{direct.base_url}/v1/completions", "Envoy -> simulator (no ext_proc)", envoy_pid=direct.pid,
            sim_pid=sim_pid,
        )  # fmt: skip
        paths["epp"] = Path_(
            f"{stack.envoy.base_url}/v1/completions", "Envoy + EPP (ours) -> simulator", stack.epp.pid,
            stack.envoy.pid, True, sim_pid, ours=True,
        )  # fmt: skip
        for index, (command, envoy_options) in enumerate(compared):
            other = stack_of.enter_context(
                ForeignEpp(
                    command,
                    POOL,
                    NAMESPACE,
                    plane.access.kubeconfig_path,
                    sim_metric_args(command),
                    fixed_port_wait=args.fixed_port_wait,
                )
            )
            other.wait_serving()
            envoy = stack_of.enter_context(
                Envoy(other.ext_proc_address, options=envoy_options, ext_proc_tls=other.ext_proc_tls)
            )
            # The v1 set-up reads its model servers from a file: the pool's endpoint, as a gateway lists it.
            if envoy_options.follow_pool_endpoints:
                envoy.set_model_server_endpoints([f"{ip}:{SIM_PORT}"])
            paths[f"other{index}"] = Path_(
                f"{envoy.base_url}/v1/completions", f"Envoy + {command.name} -> simulator", other.pid,
                envoy.pid, True, sim_pid, ours=command.dialect == "ours",
                full_duplex=envoy_options.request_body_mode == "FULL_DUPLEX_STREAMED",
            )  # fmt: skip
            print(f"compared: {command.name}: {shlex.join(other.argv())}")
        print(
            f"measuring: {args.c1_requests} sequential and {args.c32_requests} at {HIGH_CONCURRENCY}"
            f" in flight per path ({args.load_generator}), {args.rounds} alternating rounds,"
            f" simulator time_scale {args.time_scale}"
        )
        if args.load_generator == H2LOAD:
            load_h2load.ensure_h2load()
        began = time.monotonic()
        stats = asyncio.run(run_rounds(paths, args))
        print(f"measured in {time.monotonic() - began:.1f} s, load average {os.getloadavg()[0]:.2f}")
    report(stats, paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
