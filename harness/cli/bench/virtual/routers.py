"""The policies a virtual-time run compares, all in the same loop over the same engines.

* ``epp``: the EPP's real scheduling code (``EppHost``) with our measured default profile;
  ``epp[filter-tree]`` the v0.3.0 filter tree; ``epp[last-routed]`` the default profile with the
  opt-in last-routed scorer at its measured weight (``LAST_ROUTED_OPT_IN_WEIGHT``);
  ``epp[no-predicted-ttft]`` the default profile without the predicted-TTFT scorer (the default
  until 6 Dec 2026), to show what that scorer adds; ``epp[no-response-body]`` the default behind an
  Envoy that sends the EPP no response body (no first token reaches it).
* ``upstream-v1.5-default``: the same code with upstream v1.5.0's default profile (queue 2, KV cache 2,
  prefix 3, max-score picker) read through our EndpointPickerConfig loader — the document of
  ``examples/config/upstream-default.yaml`` (a unit test keeps the two equal).
* ``round-robin``, ``random``: blind.
* ``least-outstanding``: the fewest requests this router has in flight (ties at random), what
  Envoy's least-request balancer and Kubernetes-style proxies approximate.
* ``power-of-two``: two pods at random, the one with fewer in flight.
* ``oracle``: the lowest first-token estimate from every engine's true state
  (``Engine.estimate_ttft``: queue, remaining output of each running request, cached prefix, loaded
  adapters), read at the moment of the decision.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from epp.config import FILTER_TREE, LAST_ROUTED_OPT_IN_WEIGHT, ProberConfig, SchedulerConfig, ScorerWeights
from epp.errors import ResourceExhausted
from epp.pickerconfig import load_picker_config
from harness.base.shipped import shipped_path
from harness.cli.bench.virtual.cluster import Router, Shed, VirtualCluster
from harness.cli.bench.virtual.epp_host import EppHost
from harness.cli.bench.workload import TraceRequest
from harness.sim import EngineState

# Upstream v1.5.0's default scheduling, the file a user passes with --config-file (shipped with the
# wheel, so the bench reads exactly what users read).
UPSTREAM_V15_DEFAULT_FILE = "examples/config/upstream-default.yaml"

EPP = "epp"
UPSTREAM_DEFAULT = "upstream-v1.5-default"
ROUND_ROBIN = "round-robin"
RANDOM = "random"
LEAST_OUTSTANDING = "least-outstanding"
POWER_OF_TWO = "power-of-two"
ORACLE = "oracle"
EPP_FILTER_TREE = "epp[filter-tree]"
EPP_LAST_ROUTED = "epp[last-routed]"
EPP_NO_PREDICTED_TTFT = "epp[no-predicted-ttft]"
EPP_NO_RESPONSE_BODY = "epp[no-response-body]"
ALL = (EPP, UPSTREAM_DEFAULT, ORACLE, LEAST_OUTSTANDING, POWER_OF_TWO, ROUND_ROBIN, RANDOM)
KNOWN = (*ALL, EPP_FILTER_TREE, EPP_LAST_ROUTED, EPP_NO_PREDICTED_TTFT, EPP_NO_RESPONSE_BODY)


def upstream_default_config() -> SchedulerConfig:
    text = shipped_path(UPSTREAM_V15_DEFAULT_FILE).read_text(encoding="utf-8")
    return load_picker_config(text, scheduler=SchedulerConfig(), prober=ProberConfig()).scheduler


@dataclass
class EppRouter:
    """The EPP's scheduling, datastore and accounting (``EppHost``) behind the Router interface."""

    name: str
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    seed: int = 0
    response_body_sent: bool = True
    _host: EppHost | None = field(default=None, init=False)
    _model: str = field(default="", init=False)

    def start(self, cluster: VirtualCluster) -> None:
        loop = cluster.loop
        self._host = EppHost(
            self.config,
            len(cluster.pods),
            lambda: loop.now,
            random.Random(self.seed),
            response_body_sent=self.response_body_sent,
        )
        self._model = cluster.config.sim.model
        self._max_loras = cluster.config.sim.max_loras

    def route(self, request: TraceRequest, hashes: Sequence[int], now: float) -> tuple[int, object]:
        host = self._host
        assert host is not None
        try:
            return host.route(
                request.prompt_head(host.head_chars),
                request.served_model,
                request.priority >= 0,
                request.body_bytes,
            )
        except ResourceExhausted as exc:
            raise Shed(str(exc)) from None

    def first_token(self, pod: int, handle: object, now: float) -> object:
        assert self._host is not None
        return self._host.first_byte(handle)  # type: ignore[arg-type]

    def finished(self, pod: int, handle: object, now: float) -> None:
        assert self._host is not None
        self._host.finished(handle)  # type: ignore[arg-type]

    def scraped(self, pod: int, state: EngineState, now: float) -> None:
        assert self._host is not None
        self._host.scraped(pod, state, self._max_loras, now)


@dataclass
class CountingRouter:
    """A router that knows only what it sent: ``choose(counts, rng)`` over its in-flight counts."""

    name: str
    choose: Callable[[list[int], random.Random, int], int]
    seed: int = 0
    _counts: list[int] = field(default_factory=list, init=False)
    _rng: random.Random = field(default_factory=random.Random, init=False)
    _sent: int = field(default=0, init=False)

    def start(self, cluster: VirtualCluster) -> None:
        self._counts = [0] * len(cluster.pods)
        self._rng = random.Random(self.seed)
        self._sent = 0

    def route(self, request: TraceRequest, hashes: Sequence[int], now: float) -> tuple[int, object]:
        pod = self.choose(self._counts, self._rng, self._sent)
        self._sent += 1
        self._counts[pod] += 1
        return pod, None

    def first_token(self, pod: int, handle: object, now: float) -> object:
        return handle

    def finished(self, pod: int, handle: object, now: float) -> None:
        self._counts[pod] -= 1

    def scraped(self, pod: int, state: EngineState, now: float) -> None:
        pass


def _round_robin(counts: list[int], rng: random.Random, sent: int) -> int:
    return sent % len(counts)


def _random(counts: list[int], rng: random.Random, sent: int) -> int:
    return rng.randrange(len(counts))


def _least(counts: list[int], rng: random.Random, sent: int) -> int:
    low = min(counts)
    ties = [i for i, c in enumerate(counts) if c == low]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


def _power_of_two(counts: list[int], rng: random.Random, sent: int) -> int:
    if len(counts) == 1:
        return 0
    a, b = rng.sample(range(len(counts)), 2)
    return a if counts[a] <= counts[b] else b


@dataclass
class OracleRouter:
    name: str = ORACLE
    _cluster: VirtualCluster | None = field(default=None, init=False)

    def start(self, cluster: VirtualCluster) -> None:
        self._cluster = cluster

    def route(self, request: TraceRequest, hashes: Sequence[int], now: float) -> tuple[int, object]:
        cluster = self._cluster
        assert cluster is not None
        lora = None if request.served_model == cluster.config.sim.model else request.served_model
        best, best_estimate = 0, float("inf")
        for i, engine in enumerate(cluster.engines):
            estimate = engine.estimate_ttft(
                lora=lora, prompt_tokens=request.prompt_tokens, block_hashes=hashes
            )
            if estimate < best_estimate:
                best, best_estimate = i, estimate
        return best, None

    def first_token(self, pod: int, handle: object, now: float) -> object:
        return handle

    def finished(self, pod: int, handle: object, now: float) -> None:
        pass

    def scraped(self, pod: int, state: EngineState, now: float) -> None:
        pass


def make_router(name: str, seed: int = 0) -> Router:
    """A fresh router by name (``KNOWN``); ValueError for another."""
    if name == EPP:
        return EppRouter(EPP, SchedulerConfig(), seed)
    if name == EPP_FILTER_TREE:
        return EppRouter(EPP_FILTER_TREE, SchedulerConfig(kind=FILTER_TREE), seed)
    if name == EPP_LAST_ROUTED:
        weights = ScorerWeights(last_routed=LAST_ROUTED_OPT_IN_WEIGHT)
        return EppRouter(EPP_LAST_ROUTED, SchedulerConfig(weights=weights), seed)
    if name == EPP_NO_RESPONSE_BODY:
        return EppRouter(EPP_NO_RESPONSE_BODY, SchedulerConfig(), seed, response_body_sent=False)
    if name == EPP_NO_PREDICTED_TTFT:
        weights = ScorerWeights(predicted_ttft=0.0)
        return EppRouter(EPP_NO_PREDICTED_TTFT, SchedulerConfig(weights=weights), seed)
    if name == UPSTREAM_DEFAULT:
        return EppRouter(UPSTREAM_DEFAULT, upstream_default_config(), seed)
    if name == ORACLE:
        return OracleRouter()
    counting = {
        ROUND_ROBIN: _round_robin,
        RANDOM: _random,
        LEAST_OUTSTANDING: _least,
        POWER_OF_TWO: _power_of_two,
    }
    if name in counting:
        return CountingRouter(name, counting[name], seed)
    raise ValueError(f"unknown virtual policy {name!r}; known: {', '.join(KNOWN)}")
