"""The trace generator: deterministic, and its distributions have the shapes it promises."""

from __future__ import annotations

import collections
import statistics

import pytest

from harness.cli.bench.workload import (
    SHAREGPT_INPUT_MEAN,
    SHAREGPT_OUTPUT_MEAN,
    SharedPrefix,
    WorkloadSpec,
    generate,
    inference_model_name,
    zipf_weights,
)

BIG = WorkloadSpec(requests=8_000, rate=50.0, seed=3)


def test_same_seed_same_trace_and_another_seed_another() -> None:
    spec = WorkloadSpec(requests=200, seed=11)
    assert generate(spec) == generate(spec)
    assert generate(spec).requests != generate(WorkloadSpec(requests=200, seed=12)).requests


def test_lengths_follow_the_sharegpt_means_and_are_clipped() -> None:
    trace = generate(BIG)
    prompts = [r.prompt_tokens for r in trace.requests]
    outputs = [r.max_tokens for r in trace.requests]
    # Clipping at 1,024 input / 512 output tokens trims the log-normal tails, so the means land below.
    assert statistics.mean(prompts) == pytest.approx(SHAREGPT_INPUT_MEAN, rel=0.12)
    assert 0.7 * SHAREGPT_OUTPUT_MEAN < statistics.mean(outputs) < SHAREGPT_OUTPUT_MEAN
    assert max(prompts) <= 1024
    assert max(outputs) <= 512
    assert statistics.median(prompts) < statistics.mean(prompts)  # long right tail


def test_length_scale_shrinks_lengths_keeping_the_shape() -> None:
    full = generate(BIG)
    eighth = generate(WorkloadSpec(requests=8_000, rate=50.0, seed=3, length_scale=0.125))
    ratio = statistics.mean(r.max_tokens for r in eighth.requests) / statistics.mean(
        r.max_tokens for r in full.requests
    )
    assert ratio == pytest.approx(0.125, rel=0.1)


@pytest.mark.parametrize(("arrival", "cv"), [("poisson", 1.0), ("gamma", 2.0)])
def test_arrivals_have_the_mean_rate_and_their_burstiness(arrival: str, cv: float) -> None:
    trace = generate(WorkloadSpec(requests=8_000, rate=40.0, arrival=arrival, gamma_shape=0.25, seed=5))  # type: ignore[arg-type]
    gaps = [b.at - a.at for a, b in zip(trace.requests, trace.requests[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(1 / 40.0, rel=0.05)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(cv, rel=0.1)


def test_adapter_popularity_is_zipf_and_criticality_follows_the_mix() -> None:
    trace = generate(BIG)
    counts = collections.Counter(r.served_model for r in trace.requests)
    n = len(trace.requests)
    weights = zipf_weights(4, BIG.zipf_s)
    for adapter, weight in zip(BIG.adapters, weights, strict=True):
        assert counts[adapter] / n == pytest.approx((1 - BIG.base_share) * weight, rel=0.08)
    assert counts[BIG.base_model] / n == pytest.approx(BIG.base_share, rel=0.08)
    crit = collections.Counter(r.criticality for r in trace.requests)
    for name, share in BIG.criticality_mix:
        assert crit[name] / n == pytest.approx(share, rel=0.08)


def test_each_request_names_the_inference_model_of_its_served_model_and_criticality() -> None:
    request = generate(WorkloadSpec(requests=1, seed=1)).requests[0]
    assert request.model == inference_model_name(request.served_model, request.criticality)
    assert inference_model_name("meta-llama/Llama-3.1-8B-Instruct", "Sheddable") == (
        "llama-3.1-8b-instruct-sheddable"
    )


def test_shared_prefix_groups_share_their_system_prompt() -> None:
    shared = SharedPrefix(groups=4, system_tokens=100, question_tokens=10)
    trace = generate(WorkloadSpec(requests=200, shared_prefix=shared, seed=2))
    by_group = collections.defaultdict(list)
    for r in trace.requests:
        assert r.group is not None
        by_group[r.group].append(r.prompt)
    assert sorted(by_group) == [0, 1, 2, 3]
    heads = {g: {p[:400] for p in prompts} for g, prompts in by_group.items()}
    assert all(len(h) == 1 for h in heads.values())  # 100 tokens of system prompt, shared
    assert len({next(iter(h)) for h in heads.values()}) == 4  # and different between groups
    assert len({r.prompt for r in trace.requests}) == 200  # questions differ
    assert all(r.prompt_tokens == 110 for r in trace.requests)


def test_prompts_are_unique_without_shared_prefix() -> None:
    trace = generate(WorkloadSpec(requests=500, seed=4))
    assert len({r.prompt[:16] for r in trace.requests}) == 500
