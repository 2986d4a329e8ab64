"""Pure request-side logic: which model goes upstream and what the request is worth.

No I/O and no protobuf here, so every rule is table-testable. Failures are `EppError`s carrying the
one-line message the client sees. One shape for both API generations (epp.api.types): nothing here
knows which one the datastore was filled from.

`resolve` (reference/upstream-v1.md §a, §c; epp-behaviour.md §6.5):
- the rewrite rule deciding the body's `model` comes from the datastore (Exact > catch-all >
  oldest object > rule order); a pool that serves declared models only (v1alpha2) refuses a model no
  rule matches with 404, any other passes it on unchanged;
- the target: the header `x-gateway-model-name-rewrite` when the client sends one, else a weighted
  draw over the rule's targets, else the model itself;
- the priority: the InferenceObjective the header `x-gateway-inference-objective` names, else the
  objective the rule implies (a v1alpha2 criticality), else 0. Below 0 the request is sheddable.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from epp.api.types import (
    DEFAULT_OBJECTIVE_PRIORITY,
    InferencePool,
    Objective,
    RewriteMatch,
    RewriteRule,
)
from epp.errors import ModelNotFound

OBJECTIVE_HEADER = "x-gateway-inference-objective"
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"


class ModelView(Protocol):
    """The datastore reads `resolve` needs (the Datastore Protocol satisfies it)."""

    def rewrite_match(self, model: str) -> RewriteMatch | None: ...

    def objective_get(self, name: str) -> Objective | None: ...


@dataclass(frozen=True, slots=True)
class Resolved:
    target: str  # what the model server gets
    priority: int
    # Whether the names are ours (declared in an object) rather than the client's: only declared
    # names become metric label values, so clients cannot create series (DESIGN.md §6).
    model_declared: bool
    target_declared: bool

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


def not_found(model_name: str) -> ModelNotFound:
    return ModelNotFound(f"model {_one_line(model_name)[:256]} not found")


def resolve(
    pool: InferencePool, view: ModelView, model: str, headers: Mapping[str, str], rng: random.Random
) -> Resolved:
    """`headers` are the request's, with lower-case names."""
    match = view.rewrite_match(model)
    if match is None and pool.declared_models_only:
        raise not_found(model)
    override = headers.get(MODEL_REWRITE_HEADER, "")
    if override:
        target, target_declared = override, False
    elif match is not None:
        target, target_declared = pick_target(match.rule, model, rng), True
    else:
        target, target_declared = model, False
    return Resolved(
        target=target,
        priority=_priority(view, match, headers.get(OBJECTIVE_HEADER, "")),
        model_declared=match is not None and match.exact,
        target_declared=target_declared,
    )


def _priority(view: ModelView, match: RewriteMatch | None, objective_name: str) -> int:
    if objective_name:
        named = view.objective_get(objective_name)
        if named is not None:
            return named.effective_priority
    implied = match.rewrite.objective if match is not None else None
    if implied is not None:
        return implied.effective_priority
    return DEFAULT_OBJECTIVE_PRIORITY


def pick_target(rule: RewriteRule, model: str, rng: random.Random) -> str:
    """The model name to send upstream (epp-behaviour.md §6.5).

    No targets: the model itself (direct passthrough). Weights on the first entry: a weighted draw
    in [0, sum) where weight-0 entries never win. No weights: a uniform choice (#427).
    """
    targets = rule.targets
    if not targets:
        return model
    if targets[0].weight is None:
        return rng.choice(targets).name
    total = sum(t.weight or 0 for t in targets)
    if total <= 0:
        raise ModelNotFound(f"model {_one_line(model)[:256]} has no target model with a positive weight")
    r = rng.randrange(total)
    for t in targets:
        weight = t.weight or 0
        if r < weight:
            return t.name
        r -= weight
    raise AssertionError("unreachable: r < total")  # pragma: no cover
