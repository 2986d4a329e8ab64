"""The demo's environment: a throw-away control plane and a ``Stack`` in the ``demo`` namespace.

Also what ``harness up --with-epp`` keeps running. Besides the sample models (``DEMO_MODELS``) it
applies one Critical model on the base model, ``LOAD_MODEL``, that the saturated phase uses to
load the pods for real.
"""

from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import httpx2

from harness.base.binaries import kubectl_path
from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, DEMO_ADAPTERS, DEMO_MODELS, ModelSpec, Stack, StackOptions
from harness.cli.command import StartError, interrupts_deferred, say, start_control_plane
from harness.cluster.controlplane import ControlPlane
from harness.cluster.releases import session_generation
from harness.sim import SimConfig
from harness.subject.foreign_epp import EppCommand

NAMESPACE: Final = "demo"
SIM_PORT: Final = 8000
LOAD_MODEL: Final = ModelSpec("background-load", "background-load", "Critical", ((BASE_MODEL, None),))
MODELS: Final = (*DEMO_MODELS, LOAD_MODEL)
# Simulated time at half speed: a request of a few hundred tokens takes about a second, so the
# saturated phase can keep every pod's queue full with a few dozen requests in flight.
SIM_CONFIG: Final = SimConfig(
    model=BASE_MODEL, lora_adapters=DEMO_ADAPTERS, max_loras=2, max_num_seqs=8, time_scale=0.5
)
METRICS_SETTLE_TIMEOUT_S: Final = 30.0
SHEDDABLE_PROBE_MODEL: Final = "summaries-batch"


class DemoEnvironment:
    """Control plane + ``Stack`` in the ``demo`` namespace; ``stop()`` is idempotent.

    ``pool`` (namespace, name): instead of the demo's pool, models and pods, only the EPP and Envoy
    for that pool, which the user then applies with kubectl (``harness up --with-epp --pool``).
    ``epp_command``: run that EPP instead of ours (``--epp-command``, `harness.subject.foreign_epp`).
    """

    def __init__(
        self,
        pods: int = 4,
        models: Sequence[ModelSpec] = MODELS,
        pool: tuple[str, str] | None = None,
        epp_command: EppCommand | None = None,
    ) -> None:
        self.epp_command = epp_command
        self.pods = 0 if pool else pods
        self.models = () if pool else tuple(models)
        self.pool = pool
        self.plane: ControlPlane | None = None
        self.stack: Stack | None = None

    @property
    def namespace(self) -> str:
        return self.pool[0] if self.pool else NAMESPACE

    def start(self) -> None:
        self.plane = start_control_plane()
        began = time.monotonic()
        if self.pool is None:
            say(f"starting {self.pods} simulated vLLM pods, the pool and models, the EPP and Envoy ...")
            options = StackOptions(
                namespace=NAMESPACE,
                pods=self.pods,
                models=self.models,
                sim_config=SIM_CONFIG,
                epp_command=self.epp_command,
            )
        else:
            say(f"starting the EPP and Envoy for pool {self.pool[1]} in namespace {self.pool[0]} ...")
            options = StackOptions(
                namespace=self.pool[0], pool_name=self.pool[1], apply_pool=False, epp_command=self.epp_command
            )
        self.stack = Stack(self.plane.access, options)
        try:
            self.stack.start()
        except Exception as exc:
            raise StartError(f"the stack did not start: {exc}") from exc
        say(f"  up in {time.monotonic() - began:.1f} s; Envoy listens on {self.stack.base_url}")

    def stop(self) -> None:
        """Stop the stack, then the control plane; further Ctrl-C only prints a note meanwhile."""
        with interrupts_deferred():
            try:
                if self.stack is not None:
                    self.stack.stop()
                    self.stack = None
            finally:
                if self.plane is not None:
                    self.plane.stop()
                    self.plane = None

    @property
    def running_stack(self) -> Stack:
        if self.stack is None:
            raise RuntimeError("the demo environment is not running")
        return self.stack

    def dead_processes(self) -> list[str]:
        dead: list[str] = []
        if self.plane is not None:
            dead += self.plane.dead_processes()
        if self.stack is not None:
            dead += self.stack.dead_processes()
        return dead

    def log_tails(self) -> str:
        parts = []
        if self.plane is not None:
            parts.append(self.plane.log_tails(40))
        if self.stack is not None:
            parts.append(self.stack.log_tails())
        return "\n".join(parts)

    def wait_epp_sees(self, condition: Callable[[dict[str, Any]], bool], what: str) -> list[dict[str, Any]]:
        """Until every pod's metrics in the EPP's datastore meet ``condition``; those metrics."""
        stack = self.running_stack

        def seen() -> list[dict[str, Any]]:
            pods = stack.datastore_view().get("pods") or []
            assert len(pods) == self.pods, f"EPP holds {len(pods)}/{self.pods} pods"
            metrics = [p["metrics"] for p in pods]
            assert all(condition(m) for m in metrics), f"EPP does not see {what} yet: {metrics}"
            return metrics

        return eventually(seen, timeout=METRICS_SETTLE_TIMEOUT_S, message=f"the EPP saw {what}")

    def wait_sheddable(self, shed: bool) -> None:
        """For an EPP without a datastore view: until a Sheddable request is shed (429), or served.

        An EPP sheds it only when it sees no pod with room, so a 429 says what the view would have.
        """
        stack = self.running_stack
        body = {"model": SHEDDABLE_PROBE_MODEL, "prompt": "is there room?", "max_tokens": 1}

        headers = stack.cluster.objective_headers(SHEDDABLE_PROBE_MODEL) if stack.cluster is not None else {}

        def answered() -> None:
            url = f"{stack.base_url}/completions"
            status = httpx2.post(url, json=body, headers=headers, timeout=60).status_code
            want = 429 if shed else 200
            assert status == want, f"a Sheddable request got {status}, waiting for {want}"

        what = "shed Sheddable requests" if shed else "serve Sheddable requests again"
        eventually(answered, timeout=METRICS_SETTLE_TIMEOUT_S, message=f"the EPP {what}")


def print_access(env: DemoEnvironment, copy_to: Path | None) -> None:
    plane, stack = env.plane, env.running_stack
    assert plane is not None
    kubeconfig = plane.kubeconfig_path
    if copy_to is not None:
        shutil.copyfile(kubeconfig, copy_to)
        copy_to.chmod(0o600)
        kubeconfig = copy_to.resolve()
    base = (
        f"{shlex.quote(str(kubectl_path()))} --kubeconfig {shlex.quote(str(kubeconfig))} -n {env.namespace}"
    )
    kinds = ",".join(("inferencepools", *session_generation().model_plurals, "pods"))
    kubectl = f"{base} get {kinds} -o wide"
    body = '{"model": "food-review", "prompt": "Review: great tacos. Sentiment?", "max_tokens": 16}'
    curl = f"curl -s {stack.base_url}/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"
    if env.pool is None:
        print(f"environment is up: control plane, EPP, Envoy and {env.pods} simulated vLLM pods", flush=True)
    else:
        print(
            f"environment is up: control plane, node agent, EPP and Envoy for pool {env.pool[1]}", flush=True
        )
    print(f"kubeconfig: {kubeconfig}")
    print(f"kubectl:    {kubectl}")
    if env.pool is not None:
        print(f"apply:      {base} apply -f {session_generation().example_manifest}")
    print(f"export OPENAI_BASE_URL={stack.base_url}")
    print("export OPENAI_API_KEY=unused")
    print(f"curl:       {curl}")
    if stack.epp is not None:
        print(f"EPP:        {stack.epp.metrics_url}/metrics  {stack.epp.debug_url}/debug/datastore")
    else:
        view = "" if stack.white_box else "; no datastore view"
        print(f"EPP:        {stack.epp_name}: {stack.epp_metrics_url}/metrics (bearer token){view}")
    if plane.access.node_agent_url:
        print(f"pods:       {plane.access.node_agent_url}/debug/pods (the node agent's view)")
    if env.models:
        print("models:")
    for model in env.models:
        print(f"  {model.model_name:<34} {model.criticality or 'Standard':<10} {_targets_text(model)}")
    print("Press Ctrl-C to stop.", flush=True)


def _targets_text(model: ModelSpec) -> str:
    if not model.targets:
        return "(served as is)"
    weights = [w for _, w in model.targets]
    if len(model.targets) == 1:
        return f"-> {model.targets[0][0]}"
    total = sum(w or 0 for w in weights) or len(weights)
    return "-> " + ", ".join(f"{name} {100 * (w or 1) / total:.0f}%" for name, w in model.targets)
