"""The routing policies the benchmark compares, each a way to pick a pod for a request.

* ``epp``: our EPP as its own process, behind Envoy (ext_proc), as in production. Requests carry the
  InferenceModel name (with its criticality); the EPP resolves it to the served model.
* ``envoy-round-robin``, ``envoy-least-request``, ``envoy-random``: Envoy straight to the pods with
  its own load balancer (what a Kubernetes Service-like proxy gives).
* ``vllm-router:<policy>`` and ``sglang-router:<policy>``: the two Rust routers from PyPI (extra
  ``[peers]``), skipped with a note when not installed. Bound to 127.0.0.1 explicitly (SGLang defaults
  to 0.0.0.0), each with its own Prometheus port, per-request logging off
  (reference/peer-routers.md, gotchas).
* ``oracle``: the client itself picks the pod with the lowest first-token estimate computed from the
  simulators' true state (queue, remaining output of every running request, cached prefix, loaded
  adapters), read in-process, and sends the request through an Envoy that follows its pick. The
  best a router could do, behind the same kind of proxy hop as the others.

Every policy except the EPP sends the served model name (a base model or an adapter), so the model
servers see the same requests whichever policy routes them.
"""

from __future__ import annotations

import random
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from harness.base.eventually import eventually
from harness.base.ports import LOOPBACK
from harness.base.process import ChildProcesses, ManagedProcess
from harness.cli.bench.loadgen import Target
from harness.cli.bench.workload import TraceRequest
from harness.cluster.builders import objective_headers
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.metrics_access import MetricsReader
from harness.cluster.releases import session_generation
from harness.dataplane.envoy import DESTINATION_HEADER as DESTINATION
from harness.dataplane.envoy import Envoy, EnvoyOptions, LbPolicy, LoadBalancerEnvoy
from harness.sim import ModelServerSim
from harness.subject.epp_process import EppProcess
from harness.subject.foreign_epp import EppCommand, ForeignEpp, sim_metric_args

E = TypeVar("E", bound="_Parkable")
COMPLETIONS = "/v1/completions"
VLLM_ROUTER_POLICIES = ("round_robin", "power_of_two", "cache_aware")
SGLANG_ROUTER_POLICIES = ("round_robin", "cache_aware")
_PEER_START_TIMEOUT_S = 30.0
# A resumed EPP's metrics count as fresh again below this age (it scrapes every 50 ms).
FRESH_S = 0.5


@dataclass(frozen=True)
class PoolView:
    """What a policy needs to know of the pool it routes to."""

    sims: Sequence[ModelServerSim]
    namespace: str
    pool_name: str
    kubeconfig: Path

    @property
    def endpoints(self) -> list[str]:
        return [sim.address for sim in self.sims]


class Policy(Protocol):
    name: str

    def start(self, pool: PoolView) -> None:
        """Start whatever routes (processes); return when it serves."""
        ...

    def stop(self) -> None: ...

    def begin_run(self) -> None:
        """A new run starts on freshly reset simulators (forget per-run state, wake up)."""
        ...

    def end_run(self) -> None:
        """Its run is over; other policies' runs follow (an idle policy should cost no CPU)."""
        ...

    async def route(self, request: TraceRequest) -> Target:
        """Runs on the simulators' event loop, right before the request is sent."""
        ...


def bin_path(name: str) -> Path | None:
    """A console script of this environment (next to the interpreter), else one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    found = shutil.which(name)
    return Path(found) if found else None


# ---- Envoy's own load balancers ------------------------------------------------------------------


@dataclass
class EnvoyPolicy:
    name: str
    lb_policy: LbPolicy
    _envoy: LoadBalancerEnvoy | None = field(default=None, init=False)
    _url: str = field(default="", init=False)

    def start(self, pool: PoolView) -> None:
        self._envoy = LoadBalancerEnvoy(pool.endpoints, self.lb_policy)
        self._envoy.start()
        self._url = self._envoy.base_url + COMPLETIONS

    def stop(self) -> None:
        if self._envoy is not None:
            self._envoy.stop()
            self._envoy = None

    def begin_run(self) -> None:
        pass

    def end_run(self) -> None:
        pass

    async def route(self, request: TraceRequest) -> Target:
        return Target(self._url, request.served_model)


# ---- the EPP behind Envoy ------------------------------------------------------------------------


class _Parkable(Protocol):
    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class _ParkedEpp(Generic[E]):
    """An EPP process behind its own Envoy, paused (SIGSTOP) between its runs: its probes would
    otherwise scrape every pod 20 times a second through every other policy's runs, taking CPU from
    them. Subclasses start both and say, in `begin_run`, when a resumed EPP may route again."""

    _epp: E | None = field(default=None, init=False)
    _envoy: Envoy | None = field(default=None, init=False)
    _url: str = field(default="", init=False)
    _paused: bool = field(default=False, init=False)

    def stop(self) -> None:
        if self._paused and self._epp is not None:
            self._epp.resume()  # a stopped process cannot act on SIGTERM
            self._paused = False
        try:
            if self._envoy is not None:
                self._envoy.stop()
                self._envoy = None
        finally:
            if self._epp is not None:
                self._epp.close()
                self._epp = None

    def end_run(self) -> None:
        epp = self._epp
        if epp is not None and not self._paused:
            epp.pause()
            self._paused = True

    def _resume(self) -> E | None:
        """Continue a paused EPP; the EPP, or None when it was not paused (nothing to wait for)."""
        epp = self._epp
        if epp is None or not self._paused:
            return None
        epp.resume()
        self._paused = False
        return epp

    async def route(self, request: TraceRequest) -> Target:
        # Ours and the others alike: each model's InferenceObjective has its name (``BenchPool``).
        return Target(
            self._url, request.model, tuple(objective_headers(request.model, session_generation()).items())
        )


@dataclass
class EppPolicy(_ParkedEpp[EppProcess]):
    """Our EPP behind the harness's default gateway (request body BUFFERED, no response body to the
    EPP, so the predicted-TTFT scorer abstains), or `envoy` options of another set-up.

    Not upstream's v1 set-up (`EnvoyOptions.v1()`, both bodies FULL_DUPLEX_STREAMED) by default:
    measured on this 2-core machine, which hosts the 8 simulators, Envoy and the EPP together, every
    response chunk's round trip through the EPP took enough CPU that the simulators fell behind (CPU
    lag 6.5%) and the path grew from 2 to 11 ms at 0.9x: the EPP's TTFT p90 went from 20 to 67 ms for
    the machine's sake, not the routing's (README "Routing quality")."""

    name: str
    epp_args: Sequence[str] = ()
    epp_env: dict[str, str] = field(default_factory=dict)
    envoy: EnvoyOptions = field(default_factory=EnvoyOptions)

    def start(self, pool: PoolView) -> None:
        try:
            self._epp = EppProcess(
                pool.pool_name,
                pool.namespace,
                pool.kubeconfig,
                extra_args=list(self.epp_args),
                extra_env=dict(self.epp_env),
            )
            self._epp.start()
            self._epp.wait_serving()
            epp = self._epp
            count = len(pool.sims)

            def scraped() -> None:
                pods = epp.datastore_view().get("pods") or []
                fresh = [p for p in pods if p.get("metricsAgeSeconds") is not None]
                assert len(fresh) == count, f"{len(fresh)}/{count} pods scraped"

            eventually(scraped, timeout=30, message="the EPP scraped every pod")
            self._envoy = Envoy(
                self._epp.ext_proc_address, options=self.envoy, ext_proc_tls=self._epp.ext_proc_tls
            )
            self._envoy.start()
            if self.envoy.follow_pool_endpoints:
                self._envoy.set_model_server_endpoints(pool.endpoints)
            self._url = self._envoy.base_url + COMPLETIONS
            self.end_run()
        except BaseException:
            self.stop()
            raise

    @property
    def process(self) -> EppProcess | None:
        return self._epp

    def begin_run(self) -> None:
        """Resume the EPP (paused between its runs) and wait until every pod's metrics are fresh."""
        epp = self._resume()
        if epp is None:
            return

        def fresh() -> None:
            pods = epp.datastore_view().get("pods") or []
            ages = [p.get("metricsAgeSeconds") for p in pods]
            assert ages, "the EPP holds no pod"
            assert all(a is not None and a < FRESH_S for a in ages), f"metrics ages {ages}"

        eventually(fresh, timeout=30, message="the resumed EPP scraped every pod again")


# ---- another EPP (GIE's, llm-d-router's) behind Envoy -------------------------------------------


@dataclass
class ForeignEppPolicy(_ParkedEpp[ForeignEpp]):
    """Another EPP binary (`harness.subject.foreign_epp`: upstream GIE v1.x, llm-d-router, ...) behind
    an Envoy set up as the harness sets one up for it (v1.x: request body FULL_DUPLEX_STREAMED and a
    list-aware cluster of the pool's endpoints). Requests name the model and objective as for ours.

    Paused between its runs as ours is (its 20 scrapes a second per pod would otherwise take CPU from
    every other policy's runs). It has no datastore view to tell when its metrics are fresh again
    after a resume, so the pods tell: every pod has served it two ``/metrics`` pages since (the
    first may answer a scrape sent before the pause); the other EPPs are paused meanwhile."""

    name: str
    command: EppCommand
    _sims: Sequence[ModelServerSim] = field(default=(), init=False)

    def start(self, pool: PoolView) -> None:
        self._sims = tuple(pool.sims)
        try:
            self._epp = ForeignEpp(
                self.command, pool.pool_name, pool.namespace, pool.kubeconfig, sim_metric_args(self.command)
            )
            self._epp.start()
            self._epp.wait_serving()
            options = self.command.envoy_options(EnvoyOptions(log_level="warning"))
            epp = self._epp
            self._envoy = Envoy(epp.ext_proc_address, options=options, ext_proc_tls=epp.ext_proc_tls)
            self._envoy.start()
            if options.follow_pool_endpoints:
                self._envoy.set_model_server_endpoints(pool.endpoints)
            self._wait_ready_pods(pool)
            self._url = self._envoy.base_url + COMPLETIONS
            self.end_run()
        except BaseException:
            self.stop()
            raise

    def _wait_ready_pods(self, pool: PoolView) -> None:
        """Until its ``inference_pool_ready_pods`` counts every pod (read with a token its metrics
        endpoint accepts): it has listed them, and its scrapes have begun."""
        epp = self._epp
        assert epp is not None
        api = ClusterAccess.from_kubeconfig(pool.kubeconfig).api_client()
        reader = MetricsReader(api, pool.namespace)
        try:

            def ready() -> None:
                text = reader.metrics_text(f"http://{LOOPBACK}:{epp.metrics_port}")
                counts = [
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("inference_pool_ready_pods")
                ]
                assert counts, "no inference_pool_ready_pods yet"
                assert max(counts) >= len(pool.sims), f"ready pods {counts}"

            eventually(ready, timeout=60, message=f"{self.name} counts every pod ready")
        finally:
            reader.close()
            api.close()  # type: ignore[no-untyped-call]

    def begin_run(self) -> None:
        """Resume it and wait until it has scraped every pod afresh (the class docstring)."""
        before = [sim.scrapes for sim in self._sims]
        if self._resume() is None:
            return

        def scraped_twice() -> None:
            behind = [s.address for s, n in zip(self._sims, before, strict=True) if s.scrapes < n + 2]
            assert not behind, f"not scraped twice since the resume: {behind}"

        eventually(scraped_twice, timeout=30, message=f"the resumed {self.name} scraped every pod again")


def foreign_epp_policy(spec: str) -> ForeignEppPolicy:
    """``NAME=COMMAND`` (e.g. ``llm-d-router=/path/to/epp``): that command line as a policy named NAME,
    its flag dialect read off its ``--help``; ``gie-vX.Y.Z`` alone: upstream GIE's EPP at that version,
    as `harness build --upstream-epp vX.Y.Z` built it."""
    name, sep, command = spec.partition("=")
    if not sep:
        return ForeignEppPolicy(epp_peer_name(spec), EppCommand.upstream(_gie_version(spec)))
    if not name or not command.strip():
        raise ValueError(f"expected NAME=COMMAND or gie-vX.Y.Z, not {spec!r}")
    return ForeignEppPolicy(name, EppCommand.from_text(command, fixed_ports=""))


def epp_peer_name(spec: str) -> str:
    """The policy name of an ``--epp-peer`` spec (see `foreign_epp_policy`)."""
    name, sep, _ = spec.partition("=")
    return name if sep else f"gie-v{_gie_version(spec)}"


def _gie_version(spec: str) -> str:
    return spec.removeprefix("gie-").removeprefix("v")


# ---- the peer routers from PyPI -----------------------------------------------------------------


@dataclass
class PeerRouterPolicy:
    """vllm-router or sglang-router (``smg launch``) with static worker URLs."""

    name: str
    router: str  # "vllm-router" or "sglang-router"
    policy: str
    _children: ChildProcesses = field(default_factory=ChildProcesses, init=False)
    _url: str = field(default="", init=False)

    @staticmethod
    def available(router: str) -> bool:
        return bin_path("vllm-router" if router == "vllm-router" else "smg") is not None

    def start(self, pool: PoolView) -> None:
        self._children = ChildProcesses()
        port, prometheus = self._children.reserve_port(), self._children.reserve_port()
        workers = [sim.base_url for sim in pool.sims]
        common = ["--host", LOOPBACK, "--port", str(port), "--prometheus-host", LOOPBACK]
        common += ["--prometheus-port", str(prometheus), "--policy", self.policy]
        if self.router == "vllm-router":
            binary = bin_path("vllm-router")
            args = [*common, "--log-level", "warning", "--worker-urls", *workers]
        else:
            binary = bin_path("smg")
            args = ["launch", *common, "--log-level", "warn", "--shutdown-grace-period-secs", "1"]
            args += ["--worker-urls", *workers]
        if binary is None:
            raise RuntimeError(f"{self.router} is not installed (pip install 'inference-epp[peers]')")
        process = ManagedProcess(
            self.router,
            binary,
            args,
            health_url=f"http://{LOOPBACK}:{port}/readiness",
            start_timeout=_PEER_START_TIMEOUT_S,
            stop_timeout=5.0,
        )
        try:
            self._children.start(process)
        except BaseException:
            self.stop()
            raise
        self._url = f"http://{LOOPBACK}:{port}{COMPLETIONS}"

    def stop(self) -> None:
        self._children.close()

    def begin_run(self) -> None:
        pass

    def end_run(self) -> None:
        pass

    async def route(self, request: TraceRequest) -> Target:
        return Target(self._url, request.served_model)


# ---- the oracle ----------------------------------------------------------------------------------


@dataclass
class OraclePolicy:
    """Picks with the simulators' true state; the request still goes through an Envoy (which follows
    the oracle's destination header), so the oracle pays the same proxy hop as the other policies and
    differs from them only in its decisions. ``proxy=False`` sends straight to the pod instead."""

    name: str = "oracle"
    proxy: bool = True
    _sims: Sequence[ModelServerSim] = field(default=(), init=False)
    # Requests routed to each simulator this run; those it has not accepted yet are still on the wire.
    _routed: list[int] = field(default_factory=list, init=False)
    _envoy: LoadBalancerEnvoy | None = field(default=None, init=False)

    def start(self, pool: PoolView) -> None:
        self._sims = tuple(pool.sims)
        if self.proxy:
            self._envoy = LoadBalancerEnvoy(pool.endpoints, "HEADER")
            self._envoy.start()
        self.begin_run()

    def stop(self) -> None:
        self._sims = ()
        if self._envoy is not None:
            self._envoy.stop()
            self._envoy = None

    def begin_run(self) -> None:
        self._routed = [0] * len(self._sims)

    def end_run(self) -> None:
        pass

    async def route(self, request: TraceRequest) -> Target:
        best = -1
        best_estimate = 0.0
        hashes: dict[str | None, tuple[int, ...]] = {}
        for i, sim in enumerate(self._sims):
            lora = None if request.served_model == sim.config.model else request.served_model
            if lora not in hashes:
                hashes[lora] = sim.block_hashes(request.prompt, lora)
            accepted = sum(sim.requests_by_model.values())
            estimate = sim.engine.estimate_ttft(
                lora=lora,
                prompt_tokens=request.prompt_tokens,
                block_hashes=hashes[lora],
                in_transit=max(0, self._routed[i] - accepted),
            )
            if best < 0 or estimate < best_estimate:
                best, best_estimate = i, estimate
        assert best >= 0, "the oracle has no pods"
        self._routed[best] += 1
        sim = self._sims[best]
        if self._envoy is None:
            return Target(sim.base_url + COMPLETIONS, request.served_model)
        return Target(self._envoy.base_url + COMPLETIONS, request.served_model, ((DESTINATION, sim.address),))


# ---- least outstanding requests (the capacity probe's router) --------------------------------------


@dataclass
class LeastOutstandingPolicy:
    """The pod with the fewest requests this policy sent and has not seen finish, ties at random;
    straight to the pods. The capacity probe routes with it (as the virtual mode's probe does): a
    saturating burst spread by load alone, as the blind policies spread it, not by an oracle's
    knowledge of adapters and caches that only some policies have. Told of each end by `finished`."""

    name: str = "least-outstanding"
    _sims: Sequence[ModelServerSim] = field(default=(), init=False)
    _outstanding: list[int] = field(default_factory=list, init=False)
    _by_url: dict[str, int] = field(default_factory=dict, init=False)
    _rng: random.Random = field(default_factory=lambda: random.Random(0), init=False)

    def start(self, pool: PoolView) -> None:
        self._sims = tuple(pool.sims)
        self._by_url = {sim.base_url + COMPLETIONS: i for i, sim in enumerate(self._sims)}
        self.begin_run()

    def stop(self) -> None:
        self._sims = ()

    def begin_run(self) -> None:
        self._outstanding = [0] * len(self._sims)

    def end_run(self) -> None:
        pass

    async def route(self, request: TraceRequest) -> Target:
        fewest = min(self._outstanding)
        pick = self._rng.choice([i for i, n in enumerate(self._outstanding) if n == fewest])
        self._outstanding[pick] += 1
        return Target(self._sims[pick].base_url + COMPLETIONS, request.served_model)

    def finished(self, target: Target) -> None:
        self._outstanding[self._by_url[target.url]] -= 1


# Scorer name -> the EPP environment variable holding its weight.
SCORER_WEIGHT_ENV = {
    "queue": "QUEUE_SCORE_WEIGHT",
    "kv_cache": "KV_CACHE_SCORE_WEIGHT",
    "prefix": "PREFIX_CACHE_SCORE_WEIGHT",
    "lora": "LORA_AFFINITY_SCORE_WEIGHT",
    "in_flight": "IN_FLIGHT_SCORE_WEIGHT",
    "last_routed": "LAST_ROUTED_SCORE_WEIGHT",
    "predicted_ttft": "PREDICTED_TTFT_SCORE_WEIGHT",
}


V1_GATEWAY = "v1-gateway"


def epp_variant(variant: str, epp_args: Sequence[str] = ()) -> EppPolicy:
    """An EPP configured differently, for ablations: ``filter-tree``, ``scorer``, ``no-<scorer>``
    (the scorer scheduler with that scorer's weight 0), ``only-<scorer>`` (every other weight 0), or
    ``v1-gateway``: the default EPP behind upstream's v1 set-up (`EnvoyOptions.v1()`), whose response
    bodies reach the EPP, so the predicted-TTFT scorer decides (see `EppPolicy` for its CPU cost here)."""
    if variant == V1_GATEWAY:
        return EppPolicy(f"epp[{variant}]", epp_args=tuple(epp_args), envoy=EnvoyOptions.v1())
    args = [a for a in epp_args if not a.startswith("--scheduler")]
    if variant in ("filter-tree", "scorer"):
        return EppPolicy(f"epp[{variant}]", epp_args=(*args, f"--scheduler={variant}"))
    kind, _, scorer = variant.partition("-")
    if kind not in ("no", "only") or scorer not in SCORER_WEIGHT_ENV:
        known = ", ".join(f"no-{s}, only-{s}" for s in SCORER_WEIGHT_ENV)
        raise ValueError(f"unknown EPP variant {variant!r}: filter-tree, scorer, {known}, {V1_GATEWAY}")
    if kind == "no":
        env = {SCORER_WEIGHT_ENV[scorer]: "0"}
    else:
        env = {name: "0" for other, name in SCORER_WEIGHT_ENV.items() if other != scorer}
    return EppPolicy(f"epp[{variant}]", epp_args=(*args, "--scheduler=scorer"), epp_env=env)


def builtin_policies(epp_args: Sequence[str] = ()) -> list[Policy]:
    return [
        EppPolicy("epp", epp_args=tuple(epp_args)),
        EnvoyPolicy("envoy-round-robin", "ROUND_ROBIN"),
        EnvoyPolicy("envoy-least-request", "LEAST_REQUEST"),
        EnvoyPolicy("envoy-random", "RANDOM"),
        OraclePolicy(),
    ]


def peer_policies() -> tuple[list[Policy], list[str]]:
    """The peer routers that are installed, and a note for each that is not."""
    found: list[Policy] = []
    notes: list[str] = []
    for router, policies in (
        ("vllm-router", VLLM_ROUTER_POLICIES),
        ("sglang-router", SGLANG_ROUTER_POLICIES),
    ):
        if PeerRouterPolicy.available(router):
            found += [PeerRouterPolicy(f"{router}:{p}", router, p) for p in policies]
        else:
            notes.append(f"{router} is not installed: skipped (pip install 'inference-epp[peers]')")
    return found, notes
