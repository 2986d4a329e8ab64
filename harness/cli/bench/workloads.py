"""The named workloads of the routing benchmark: what each one is, and the engine setting it needs.

Every one uses ShareGPT-like lengths at their real size unless its description says otherwise
(``WorkloadSpec`` defaults: log-normal prompts and outputs with ShareGPT's means, clipped at 1,024
and 512 tokens), and every request is a Standard one (priority 0: never shed) except in
``mixed-priority``, so that a policy that sheds is not rewarded for dropping work.

* ``sharegpt``: the base model only, Poisson arrivals.
* ``prefix-heavy``: multi-turn chat (``MultiTurn``): 32 tenants with a 1,500-token system prompt each
  (Zipf popularity), conversations of 4 turns on average, each resending its whole history.
* ``lora``: 16 adapters with Zipf popularity (s = 1.1), no base-model traffic, 4 adapter slots per
  engine (``max_loras`` 4).
* ``bursty``: ``sharegpt`` with gamma inter-arrival times of CV 2 (shape 0.25).
* ``mixed-priority``: ``sharegpt`` with a third each of priority 1 (Critical), 0 (Standard) and -1
  (Sheddable: the EPP may shed it when no pod has room).
* ``shared-prefix``: the live benchmark's inference-perf shape (16 groups, 6,000-token system prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from harness.cli.bench.workload import MultiTurn, SharedPrefix, WorkloadSpec

SHAREGPT = "sharegpt"
PREFIX_HEAVY = "prefix-heavy"
LORA = "lora"
BURSTY = "bursty"
MIXED_PRIORITY = "mixed-priority"
SHARED_PREFIX = "shared-prefix"
VIRTUAL_WORKLOADS = (SHAREGPT, PREFIX_HEAVY, LORA, BURSTY, MIXED_PRIORITY)
LORA_ADAPTERS = tuple(f"lora-{i}" for i in range(16))
LORA_SLOTS = 4


@dataclass(frozen=True)
class NamedWorkload:
    name: str
    spec: WorkloadSpec
    sim_changes: dict[str, Any] = field(default_factory=dict)  # SimConfig fields this workload sets

    @property
    def label(self) -> str:
        """How a report names it."""
        return f"{self.name} workload"


def named_workload(name: str, base_model: str, **changes: Any) -> NamedWorkload:
    """The workload ``name`` for ``base_model``; ``changes`` go to its WorkloadSpec. ValueError if unknown."""
    standard = (("Standard", 1.0),)
    plain = WorkloadSpec(base_model=base_model, adapters=(), base_share=1.0, criticality_mix=standard)
    if name == SHAREGPT:
        out = NamedWorkload(name, plain)
    elif name == PREFIX_HEAVY:
        out = NamedWorkload(name, replace(plain, multi_turn=MultiTurn()))
    elif name == LORA:
        spec = replace(plain, adapters=LORA_ADAPTERS, base_share=0.0, zipf_s=1.1)
        out = NamedWorkload(name, spec, {"lora_adapters": LORA_ADAPTERS, "max_loras": LORA_SLOTS})
    elif name == BURSTY:
        out = NamedWorkload(name, replace(plain, arrival="gamma", gamma_shape=0.25))
    elif name == MIXED_PRIORITY:
        mix = (("Critical", 1 / 3), ("Standard", 1 / 3), ("Sheddable", 1 / 3))
        out = NamedWorkload(name, replace(plain, criticality_mix=mix))
    elif name == SHARED_PREFIX:
        out = NamedWorkload(name, replace(plain, shared_prefix=SharedPrefix()))
    else:
        known = ", ".join((*VIRTUAL_WORKLOADS, SHARED_PREFIX))
        raise ValueError(f"unknown workload {name!r}; known: {known}")
    return replace(out, spec=replace(out.spec, **changes)) if changes else out
