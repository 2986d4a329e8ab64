"""N calibrated engines and one router in a discrete-event loop: the virtual-time cluster.

Events, all in simulated seconds (``EventLoop``), nothing waits on a wall clock:
* an arrival asks the router for a pod and puts the request into that engine at once (no network
  between them); a shed request (429) is recorded and goes nowhere;
* an engine steps as vLLM's loop does: a step starts when the engine is idle and a request arrives,
  or when its previous step ends; requests arriving meanwhile join at the next step. At a step's
  end the engine reports first tokens and finished requests; a finished request is reported to the
  router (its in-flight count goes down) at that moment;
* every ``scrape_interval`` (50 ms, each pod at its own phase) each pod's gauges are read from the
  engine's real state and handed to the router (``Router.scraped``) ``scrape_latency`` later, so a
  router that reads scrapes sees figures up to one interval old, as the EPP's prober does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from harness.cli.bench.virtual.events import EventLoop
from harness.cli.bench.workload import TraceRequest
from harness.sim import Engine, EngineState, Run, SimConfig, text_block_hashes

DEFAULT_SCRAPE_INTERVAL_S = 0.05
CHARS_PER_TOKEN = 4  # the simulator's tokenizer


@dataclass(eq=False)
class Record:
    """One request's life in a virtual run."""

    request: TraceRequest
    pod: int = -1
    shed: bool = False
    first_token: float | None = None
    finished: float | None = None
    run: Run | None = None
    handle: object = None  # the router's in-flight handle


class Shed(Exception):
    """The router refused the request (429)."""


class Router(Protocol):
    name: str

    def start(self, cluster: VirtualCluster) -> None:
        """Before the first arrival: a fresh cluster (cold engines)."""
        ...

    def route(self, request: TraceRequest, hashes: Sequence[int], now: float) -> tuple[int, object]:
        """The pod for ``request`` and a handle given back to ``finished``; raises Shed.

        ``hashes`` are the prompt's KV-block hashes as the engines key them (for the oracle)."""
        ...

    def first_token(self, pod: int, handle: object, now: float) -> object:
        """The request's first token reached the client; the handle ``finished`` gets from now on."""
        ...

    def finished(self, pod: int, handle: object, now: float) -> None: ...

    def scraped(self, pod: int, state: EngineState, now: float) -> None: ...


@dataclass(frozen=True)
class ClusterConfig:
    pods: int
    sim: SimConfig
    scrape_interval: float = DEFAULT_SCRAPE_INTERVAL_S
    scrape_latency: float = 0.0
    seed: int = 0


@dataclass
class _Pod:
    engine: Engine
    busy: bool = False


@dataclass
class VirtualCluster:
    config: ClusterConfig
    loop: EventLoop = field(default_factory=EventLoop)

    def __post_init__(self) -> None:
        if self.config.sim.time_scale != 0:
            raise ValueError("the virtual cluster's engines run in simulated time: time_scale must be 0")
        self.pods = [_Pod(Engine(self.config.sim, wall_clock=_zero)) for _ in range(self.config.pods)]
        self._open = 0  # arrivals not yet finished (or shed)
        self._arrivals_left = 0

    @property
    def engines(self) -> list[Engine]:
        return [p.engine for p in self.pods]

    def run(self, requests: Sequence[TraceRequest], router: Router) -> list[Record]:
        """Replay ``requests`` (arrival offsets from 0) through ``router``; every request's record."""
        loop = self.loop
        records = [Record(r) for r in requests]
        self._router = router
        self._arrivals_left = len(records)
        router.start(self)
        rng = random.Random(self.config.seed)
        for index in range(len(self.pods)):
            loop.at(loop.now + rng.uniform(0, self.config.scrape_interval), self._scrape, index)
        start = loop.now
        for record in records:
            loop.at(start + record.request.at, self._arrive, record)
        loop.run()
        return records

    # ---- events ---------------------------------------------------------------------------------
    def _arrive(self, record: Record) -> None:
        now = self.loop.now
        self._arrivals_left -= 1
        request = record.request
        lora = None if request.served_model == self.config.sim.model else request.served_model
        sim = self.config.sim
        hashes = text_block_hashes(request.prompt, sim.block_size, CHARS_PER_TOKEN, lora)
        try:
            pod, handle = self._router.route(request, hashes, now)
        except Shed:
            record.shed = True
            return
        record.pod, record.handle = pod, handle
        self._open += 1
        target = self.pods[pod]
        record.run = target.engine.enqueue(
            lora=lora,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            block_hashes=hashes,
            now=now,
            tag=record,
        )
        if not target.busy:
            self._start_step(pod)

    def _start_step(self, pod: int) -> None:
        target = self.pods[pod]
        end = target.engine.begin_step(self.loop.now)
        target.busy = end is not None
        if end is not None:
            self.loop.at(end, self._end_step, pod)

    def _end_step(self, pod: int) -> None:
        now = self.loop.now
        first, finished = self.pods[pod].engine.end_step(now)
        for record in first:
            assert isinstance(record, Record)
            record.first_token = now
            record.handle = self._router.first_token(pod, record.handle, now)
        for record in finished:
            assert isinstance(record, Record)
            record.finished = now
            self._open -= 1
            self._router.finished(pod, record.handle, now)
        self._start_step(pod)

    def _scrape(self, pod: int) -> None:
        if self._open == 0 and self._arrivals_left == 0:
            return  # the run is over: let the loop drain
        state = self.pods[pod].engine.state()
        latency = self.config.scrape_latency
        now = self.loop.now
        if latency > 0:
            self.loop.at(now + latency, self._deliver, (pod, state, now + latency))
        else:
            self._router.scraped(pod, state, now)
        self.loop.at(now + self.config.scrape_interval, self._scrape, pod)

    def _deliver(self, item: tuple[int, EngineState, float]) -> None:
        pod, state, now = item
        self._router.scraped(pod, state, now)


def _zero() -> float:
    return 0.0
