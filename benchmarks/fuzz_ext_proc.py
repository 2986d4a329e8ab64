"""The long fuzz profile: ≥ 100k hypothesis cases against a real EPP process, and its memory.

The same strategies and properties as the CI profile (`harness.stress.extproc_fuzz`; tests/unit/handlers/
test_fuzz.py), played over TLS against `python -m epp` as a `harness.beds.stack.Stack` runs it: a real
control plane, a pool of three simulated pods it scrapes, four InferenceModels (a weighted split, a
LoRA target, the base model, a sheddable one). Every case is a fresh ext_proc stream. A failing case
is recorded and the run goes on (no shrinking here: the CI profile shrinks).

Memory: the EPP's resident set (VmRSS) before the first case, after `--warmup` cases (every code
path taken, the allocator grown to the biggest bodies, the body-scanning child started), every 10,000
cases, and after all cases. The aim (issue 12) is at most +10% from the warm-up reading to the end;
the checkpoints in between show whether anything grows with the number of cases (a leak) or only
swings with what the last bodies were. The body-scanning child's own RSS is printed too.

    .venv/bin/python benchmarks/fuzz_ext_proc.py [--cases 100000] [--warmup 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from hypothesis import HealthCheck, given, settings

from harness.beds.stack import BASE_MODEL, ModelSpec, Stack, StackOptions
from harness.cluster.controlplane import ControlPlane
from harness.stress.extproc_fuzz import FuzzCase, FuzzWorld, Outcome, ext_proc_cases, run_case, violations

NAMESPACE = "bench-fuzz"
POD_PORT = 8000
MODELS = (
    ModelSpec("chat", "chat", "Critical", (("food-review-1", 70), ("food-review-2", 30))),
    ModelSpec("lora", "lora", "Critical", (("sql-lora-v1", None),)),
    ModelSpec("direct", BASE_MODEL, "Standard"),
    ModelSpec("batch", "batch", "Sheddable", ((BASE_MODEL, None),)),
)
MAX_MESSAGE = 64 * 1024 * 1024


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


def children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def kind_of(outcome: Outcome) -> str:
    """One word per case for the closing summary: routed, an HTTP status, or how the stream ended."""
    for reply in outcome.replies:
        if reply.HasField("immediate_response"):
            return str(reply.immediate_response.status.code)
        if reply.HasField("dynamic_metadata"):
            return "routed"
    return outcome.code.name if outcome.code is not None else "hung"


def world_of(stack: Stack) -> FuzzWorld:
    assert stack.cluster is not None
    return FuzzWorld(
        models={
            m.model_name: frozenset(t for t, _ in m.targets) or frozenset({m.model_name}) for m in MODELS
        },
        endpoints=frozenset(f"{pod.ip}:{POD_PORT}" for pod in stack.cluster.pods.values()),
    )


def run(stack: Stack, cases: int, warmup: int) -> int:
    assert stack.epp is not None
    epp, world = stack.epp, world_of(stack)
    pid = epp.pid
    assert pid is not None
    trust = epp.ext_proc_tls
    loop = asyncio.new_event_loop()
    holder: dict[str, grpc.aio.Channel] = {}

    async def connect() -> None:
        holder["channel"] = grpc.aio.secure_channel(
            epp.ext_proc_address,
            grpc.ssl_channel_credentials(root_certificates=trust.ca_pem),
            options=[
                ("grpc.ssl_target_name_override", trust.server_name),
                ("grpc.max_receive_message_length", MAX_MESSAGE),
            ],
        )

    loop.run_until_complete(connect())
    kinds: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    marks: dict[str, float] = {"rss_fresh": rss_mib(pid)}
    checkpoints: list[float] = []
    started = time.monotonic()

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=ext_proc_cases(world))
    def one_case(case: FuzzCase) -> None:
        done = sum(kinds.values())
        if done == warmup:
            marks["rss_before"] = rss_mib(pid)
            marks["t_warm"] = time.monotonic()
        outcome = loop.run_until_complete(run_case(holder["channel"], case))
        kinds[kind_of(outcome)] += 1
        broken = violations(world, case, outcome)
        if broken:
            failures.append(f"{case!r}: {broken}")
            if len(failures) <= 5:  # the first ones in full as they happen; the rest are counted
                print(f"FAILED case {done + 1}: {broken}\n  {case!r}", flush=True)
        if (done + 1) % 10_000 == 0:
            rate = (done + 1) / (time.monotonic() - started)
            rss = rss_mib(pid)
            if done + 1 > warmup:
                checkpoints.append(rss)
            print(f"  {done + 1:>7,} cases, {len(failures)} failing, {rate:.0f} cases/s, "
                  f"EPP RSS {rss:.1f} MiB", flush=True)  # fmt: skip

    try:
        one_case()
    finally:
        loop.run_until_complete(holder["channel"].close())
        holder.clear()
        loop.close()
    elapsed = time.monotonic() - started
    rss_after = rss_mib(pid)
    total = sum(kinds.values())
    rate = total / elapsed
    print(f"\n{total:,} cases in {elapsed / 60:.1f} min ({rate:.0f} cases/s); failing: {len(failures)}")
    print("outcomes: " + ", ".join(f"{kind} {n:,}" for kind, n in kinds.most_common()))
    before = marks.get("rss_before", float("nan"))
    growth = (rss_after - before) / before * 100
    print(f"EPP RSS before the first case: {marks['rss_fresh']:.1f} MiB; "
          f"after {warmup:,} warm-up cases: {before:.1f} MiB; "
          f"after {total:,} cases: {rss_after:.1f} MiB ({growth:+.1f}%; aim ≤ +10%)")  # fmt: skip
    if checkpoints:
        low, high = min(checkpoints), max(checkpoints)
        print(f"  RSS at the 10,000-case checkpoints after warm-up: {low:.1f}-{high:.1f} MiB")
    for child in children(pid):
        print(f"  body-scanning child {child}: RSS {rss_mib(child):.1f} MiB")
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=10_000)
    args = parser.parse_args(argv)
    print(f"fuzz: {args.cases:,} ext_proc streams against a real EPP process (warm-up {args.warmup:,})")
    with ControlPlane() as plane:
        options = StackOptions(namespace=NAMESPACE, pods=3, models=MODELS)
        with Stack(plane.access, options) as stack:
            targets = {m.model_name: [t for t, _ in m.targets] for m in MODELS}
            print(f"  EPP pid {stack.epp.pid if stack.epp else '?'}, 3 pods, models {json.dumps(targets)}")
            return run(stack, args.cases, args.warmup)


if __name__ == "__main__":
    sys.exit(main())
