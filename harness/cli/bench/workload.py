"""Request traces for the routing benchmark: lengths, arrivals, adapters, criticality, shared prefixes.

Deterministic from a seed (one ``random.Random``), pure, and independent of who replays the trace:
every policy of a run gets the very same requests at the very same offsets.

Where the shapes come from (no dataset is downloaded):
- ShareGPT-like lengths: log-normal prompt and output lengths with the means the vLLM paper reports
  for ShareGPT (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
  PagedAttention", SOSP 2023, §6.1: 161.31 input and 337.99 output tokens on average). The spreads
  (sigma of the logarithm) are our choice for ShareGPT's long tails. Inputs are clipped at 1,024
  tokens as GIE's benchmark config does (reference/peers-and-simulators.md §4.1); outputs at 512
  (GIE keeps up to 2,048): a run lasts until its longest request ends, and this bound keeps a run
  short. It trims the output mean from 338 to about 275 tokens.
  ``length_scale`` shrinks both (the benchmark uses it to fit a 2-core machine) keeping the shape.
- Arrivals: Poisson, or gamma inter-arrival times with shape k (coefficient of variation 1/sqrt(k);
  k < 1 is burstier than Poisson), both at the same mean rate.
- LoRA adapters with Zipf popularity (weight 1/rank^s), plus a share of base-model requests.
- A criticality mix: each request is also tagged Critical, Standard or Sheddable; the EPP sees it as a
  distinct InferenceModel name that resolves to the same served model (``TraceRequest.model``).
- Shared-prefix variant (inference-perf's ``shared_prefix``): groups of requests that share a long
  system prompt, each with its own question.
- Multi-turn chat (``MultiTurn``): tenants with a system prompt each (Zipf popularity), conversations
  whose every turn resends the system prompt and the whole history (earlier questions and answers)
  before a new question, so prompts grow turn by turn and share long prefixes.
- Priorities: each criticality stands for an InferenceObjective priority (``PRIORITIES``: Critical 1,
  Standard 0, Sheddable -1; negative means sheddable).

A prompt is kept as its parts (``TraceRequest.parts``): a system prompt or a conversation's history
is one string shared by every request that starts with it, so a trace of 20,000 multi-turn requests
holds each long prefix once.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

CHARS_PER_TOKEN = 4  # the simulator's tokenizer (harness.sim._openai.CHARS_PER_TOKEN)
CRITICALITIES = ("Critical", "Standard", "Sheddable")
PRIORITIES = {"Critical": 1, "Standard": 0, "Sheddable": -1}

SHAREGPT_INPUT_MEAN = 161.31
SHAREGPT_OUTPUT_MEAN = 337.99
SHAREGPT_INPUT_SIGMA = 1.0
SHAREGPT_OUTPUT_SIGMA = 0.8
SHAREGPT_INPUT_MAX = 1024
SHAREGPT_OUTPUT_MAX = 512

Arrival = Literal["poisson", "gamma"]
DEFAULT_CRITICALITY_MIX = (("Critical", 0.6), ("Standard", 0.25), ("Sheddable", 0.15))

_WORDS = (
    "alpha", "bravo", "cache", "delta", "engine", "fox", "gateway", "hotel", "index", "juliet",
    "kilo", "lima", "model", "node", "oscar", "prompt", "query", "route", "sierra", "token",
    "union", "victor", "whiskey", "xray", "yankee", "zulu",
)  # fmt: skip


@dataclass(frozen=True)
class SharedPrefix:
    """inference-perf's shared_prefix shape: ``groups`` system prompts, questions appended to them.

    Lengths are those of GIE's and llm-d's prefix-cache benchmark (6,000-token system prompt,
    1,200-token question; reference/peers-and-simulators.md §4.2), before ``length_scale``; fewer
    groups than their 150, so that a trace of a few hundred requests reuses each prefix.
    """

    groups: int = 16
    system_tokens: int = 6000
    question_tokens: int = 1200


@dataclass(frozen=True)
class MultiTurn:
    """Multi-turn chat over tenants that share system prompts.

    A new conversation picks a tenant (Zipf popularity, ``tenant_zipf_s``) and a number of turns
    (geometric, mean ``mean_turns``); an arrival continues a random open conversation with the share
    of follow-up turns that mean implies. Each turn's prompt is the tenant's system prompt, every
    earlier question and answer of the conversation, and a new question (ShareGPT-like length);
    a conversation ends early when its prompt would pass ``max_prompt_tokens``. No think time is
    modelled: the next turn is just a later arrival of the open-loop trace.
    """

    tenants: int = 32
    system_tokens: int = 1500
    tenant_zipf_s: float = 1.0
    mean_turns: float = 4.0
    max_prompt_tokens: int = 8192


@dataclass(frozen=True)
class WorkloadSpec:
    requests: int = 400
    rate: float = 10.0  # mean requests per simulated second
    arrival: Arrival = "poisson"
    gamma_shape: float = 0.25  # for arrival="gamma": CV of inter-arrival times = 2
    length_scale: float = 1.0
    input_mean: float = SHAREGPT_INPUT_MEAN
    input_sigma: float = SHAREGPT_INPUT_SIGMA
    input_max: int = SHAREGPT_INPUT_MAX
    output_mean: float = SHAREGPT_OUTPUT_MEAN
    output_sigma: float = SHAREGPT_OUTPUT_SIGMA
    output_max: int = SHAREGPT_OUTPUT_MAX
    base_model: str = "meta-llama/Llama-3.1-8B-Instruct"
    adapters: tuple[str, ...] = ("lora-0", "lora-1", "lora-2", "lora-3")
    zipf_s: float = 1.1
    base_share: float = 0.2  # requests for the base model; the rest go to adapters
    criticality_mix: tuple[tuple[str, float], ...] = (
        ("Critical", 0.6),
        ("Standard", 0.25),
        ("Sheddable", 0.15),
    )
    shared_prefix: SharedPrefix | None = None
    multi_turn: MultiTurn | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 1 or self.rate <= 0 or self.length_scale <= 0:
            raise ValueError("requests, rate and length_scale must be positive")
        if self.arrival not in ("poisson", "gamma") or self.gamma_shape <= 0:
            raise ValueError("arrival must be poisson or gamma (with a positive shape)")
        if not 0 <= self.base_share <= 1 or (self.base_share < 1 and not self.adapters):
            raise ValueError("base_share must be in [0, 1], and below 1 only with adapters")
        if self.shared_prefix is not None and self.multi_turn is not None:
            raise ValueError("shared_prefix and multi_turn are two different workloads: pick one")
        unknown = {c for c, _ in self.criticality_mix} - set(CRITICALITIES)
        if unknown or not self.criticality_mix or any(w < 0 for _, w in self.criticality_mix):
            raise ValueError(f"criticality_mix: weights over {CRITICALITIES}")

    def with_rate(self, rate: float) -> WorkloadSpec:
        return replace(self, rate=rate)

    @property
    def served_models(self) -> tuple[str, ...]:
        return (self.base_model, *self.adapters)


@dataclass(frozen=True)
class TraceRequest:
    index: int
    at: float  # arrival offset, simulated seconds
    served_model: str  # what a model server serves: the base model or an adapter
    criticality: str
    parts: tuple[str, ...]  # the prompt, in pieces shared with other requests (module docstring)
    prompt_tokens: int
    max_tokens: int
    group: int | None = None  # shared-prefix group, or multi-turn tenant
    conversation: int | None = None  # multi-turn conversation

    @property
    def prompt(self) -> str:
        return "".join(self.parts)

    @property
    def body_bytes(self) -> int:
        """The size of the request's body as the EPP sees it, near enough: its prompt (ASCII), the
        rest of an OpenAI body being a few dozen bytes."""
        return sum(len(part) for part in self.parts)

    def prompt_head(self, chars: int) -> str:
        """The first ``chars`` characters of the prompt, without joining all of it."""
        out: list[str] = []
        left = chars
        for part in self.parts:
            if left <= 0:
                break
            out.append(part[:left])
            left -= len(part)
        return "".join(out)

    @property
    def priority(self) -> int:
        return PRIORITIES[self.criticality]

    @property
    def model(self) -> str:
        """The InferenceModel name the EPP resolves (to ``served_model``, with this criticality)."""
        return inference_model_name(self.served_model, self.criticality)


@dataclass(frozen=True)
class Trace:
    spec: WorkloadSpec
    requests: tuple[TraceRequest, ...] = field(repr=False)

    @property
    def duration(self) -> float:
        return self.requests[-1].at if self.requests else 0.0

    @property
    def output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)


def inference_model_name(served_model: str, criticality: str) -> str:
    base = served_model.rsplit("/", 1)[-1].lower()
    return f"{base}-{criticality.lower()}"


def lognormal_params(mean: float, sigma: float) -> tuple[float, float]:
    """mu and sigma of the underlying normal for a log-normal with this mean."""
    return math.log(mean) - sigma * sigma / 2, sigma


def zipf_weights(count: int, s: float) -> list[float]:
    raw = [1.0 / (rank**s) for rank in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def generate(spec: WorkloadSpec) -> Trace:
    rng = random.Random(spec.seed)
    models = [spec.base_model, *spec.adapters]
    adapter_weights = zipf_weights(len(spec.adapters), spec.zipf_s) if spec.adapters else []
    model_weights = [spec.base_share] + [(1 - spec.base_share) * w for w in adapter_weights]
    crit_names = [c for c, _ in spec.criticality_mix]
    crit_weights = [w for _, w in spec.criticality_mix]
    in_mu, in_sigma = lognormal_params(spec.input_mean * spec.length_scale, spec.input_sigma)
    out_mu, out_sigma = lognormal_params(spec.output_mean * spec.length_scale, spec.output_sigma)
    in_max = max(1, round(spec.input_max * spec.length_scale))
    out_max = max(1, round(spec.output_max * spec.length_scale))
    systems: list[str] = []
    if spec.shared_prefix is not None:
        shared = spec.shared_prefix
        systems = [
            _text(rng, f"system prompt of group {g}: ", round(shared.system_tokens * spec.length_scale))
            for g in range(shared.groups)
        ]
    chat = _Chat(rng, spec) if spec.multi_turn is not None else None
    at = 0.0
    out: list[TraceRequest] = []
    for index in range(spec.requests):
        if index:
            at += _gap(rng, spec)
        served = rng.choices(models, model_weights)[0]
        criticality = rng.choices(crit_names, crit_weights)[0]
        output = _clipped(rng.lognormvariate(out_mu, out_sigma), out_max)
        group = conversation = None
        if chat is not None:
            question = _clipped(rng.lognormvariate(in_mu, in_sigma), in_max)
            group, conversation, parts = chat.turn(index, question, output)
        elif spec.shared_prefix is not None:
            group = rng.randrange(spec.shared_prefix.groups)
            question = round(spec.shared_prefix.question_tokens * spec.length_scale)
            parts = (systems[group], _text(rng, f"question {index}: ", max(1, question)))
        else:
            tokens = _clipped(rng.lognormvariate(in_mu, in_sigma), in_max)
            parts = (_text(rng, f"request {index}: ", tokens),)
        chars = sum(len(p) for p in parts)
        out.append(
            TraceRequest(
                index=index,
                at=at,
                served_model=served,
                criticality=criticality,
                parts=parts,
                prompt_tokens=max(1, math.ceil(chars / CHARS_PER_TOKEN)),
                max_tokens=output,
                group=group,
                conversation=conversation,
            )
        )
    return Trace(spec, tuple(out))


class _Chat:
    """The open conversations of a multi-turn trace (``MultiTurn``)."""

    def __init__(self, rng: random.Random, spec: WorkloadSpec) -> None:
        assert spec.multi_turn is not None
        self._rng = rng
        self._spec = spec.multi_turn
        system = max(1, round(self._spec.system_tokens * spec.length_scale))
        self._systems = [
            _text(rng, f"system prompt of tenant {t}: ", system) for t in range(self._spec.tenants)
        ]
        self._tenant_weights = zipf_weights(self._spec.tenants, self._spec.tenant_zipf_s)
        self._max_chars = max(1, round(self._spec.max_prompt_tokens * spec.length_scale)) * CHARS_PER_TOKEN
        # conversation id -> (tenant, history parts after the system prompt, turns left)
        self._open: dict[int, tuple[int, tuple[str, ...], int]] = {}
        self._ids: list[int] = []
        self._next = 0

    def turn(self, index: int, question_tokens: int, output_tokens: int) -> tuple[int, int, tuple[str, ...]]:
        rng = self._rng
        follow_up = 1.0 - 1.0 / max(1.0, self._spec.mean_turns)
        if self._ids and rng.random() < follow_up:
            conversation = self._ids[rng.randrange(len(self._ids))]
            tenant, history, left = self._open[conversation]
        else:
            conversation, self._next = self._next, self._next + 1
            tenant = rng.choices(range(self._spec.tenants), self._tenant_weights)[0]
            history, left = (), _geometric(rng, self._spec.mean_turns)
            self._ids.append(conversation)
        question = _text(rng, f"turn {index} of conversation {conversation}: ", question_tokens)
        parts = (self._systems[tenant], *history, question)
        answer = _text(rng, f"answer {index}: ", output_tokens)
        grown = (*history, question, answer)
        size = len(self._systems[tenant]) + sum(len(p) for p in grown)
        if left <= 1 or size >= self._max_chars:
            self._open.pop(conversation, None)
            self._ids.remove(conversation)
        else:
            # The history stays a tuple of the turns' own strings: every later turn shares them.
            self._open[conversation] = (tenant, grown, left - 1)
        return tenant, conversation, parts


def _geometric(rng: random.Random, mean: float) -> int:
    """At least 1, with the given mean."""
    p = 1.0 / max(1.0, mean)
    turns = 1
    while rng.random() > p:
        turns += 1
    return turns


def _gap(rng: random.Random, spec: WorkloadSpec) -> float:
    if spec.arrival == "poisson":
        return rng.expovariate(spec.rate)
    k = spec.gamma_shape
    return rng.gammavariate(k, 1.0 / (k * spec.rate))


def _clipped(value: float, upper: int) -> int:
    return min(upper, max(1, round(value)))


def _text(rng: random.Random, head: str, tokens: int) -> str:
    """``tokens`` tokens of text (CHARS_PER_TOKEN characters each) starting with ``head``: the head,
    then words from a random place in a fixed corpus (slicing is what keeps 20,000-request traces of
    unshrunk lengths cheap to build). Distinct heads make distinct prompts from their first block."""
    chars = tokens * CHARS_PER_TOKEN
    corpus = _corpus()
    body = chars - len(head)
    if body <= 0:
        return head[:chars]
    while len(corpus) < body:
        corpus += corpus
    start = rng.randrange(len(corpus) - body + 1)
    return head + corpus[start : start + body]


@functools.cache
def _corpus() -> str:
    words = random.Random(0x5EED)
    return "".join(words.choice(_WORDS) + " " for _ in range(60_000))


def summary(requests: Sequence[TraceRequest]) -> dict[str, float]:
    """Mean lengths and shares, for the report and the tests."""
    n = max(1, len(requests))
    return {
        "requests": float(len(requests)),
        "mean_prompt_tokens": sum(r.prompt_tokens for r in requests) / n,
        "mean_output_tokens": sum(r.max_tokens for r in requests) / n,
        "duration_s": requests[-1].at if requests else 0.0,
    }
