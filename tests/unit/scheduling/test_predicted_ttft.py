"""The predicted-TTFT scorer: the first-token time the engine's step model predicts on each pod from
the EPP's own accounting (prefills still running, requests and context in flight, the step the engine
is in, the prompt's cached prefix), scored best / predicted."""

from __future__ import annotations

import dataclasses

import pytest

from epp.config import DEFAULT_PREFIX_BLOCK_CHARS, SCORER, SchedulerConfig, ScorerWeights, StepModel
from epp.datastore.types import Dispatched, Metrics, PodMetrics
from epp.scheduling import LLMRequest
from epp.scheduling.columns import CompiledProfile
from epp.scheduling.scorers import predicted_ttft_scores, total_scores

from .pods import NOW, pm

STEP = StepModel()
BLOCK_CHARS = DEFAULT_PREFIX_BLOCK_CHARS
PROMPT = 400  # tokens
REQUEST = LLMRequest("m", "m", critical=True, prompt_tokens=PROMPT, received_at=NOW)


def decode_step(sequences: int, context_tokens: int) -> float:
    """A step that only decodes, under the default step model (what the scorer inlines)."""
    return STEP.base_s + STEP.decode_sequence_s * sequences + STEP.context_token_s * context_tokens


def flying(
    name: str,
    count: int = 0,
    prompt: int = 0,
    prefilling: int = 0,
    prefilled_at: float | None = None,
    running: int = 0,
) -> PodMetrics:
    pod = pm(name)
    return dataclasses.replace(
        pod,
        metrics=dataclasses.replace(pod.metrics, running_queue_size=running),
        dispatched=Dispatched(
            count, frozenset({"m"}) if count else frozenset(), 0, prompt, prefilling, prefilled_at
        ),
    )


def scores(*pods: PodMetrics, request: LLMRequest = REQUEST) -> list[float]:
    return predicted_ttft_scores(request, pods, BLOCK_CHARS, STEP)


def test_idle_pods_tie_whatever_was_routed_to_them_before() -> None:
    """Nothing in flight and nothing running: the prediction depends on the prompt alone, so the
    scorer never rotates requests over idle pods (the live routing tests pin scraped picks there)."""
    idle = [flying("a"), flying("b", prefilled_at=NOW - 0.001), flying("c", prefilled_at=NOW - 9.0)]
    assert scores(*idle) == [1.0, 1.0, 1.0]


def test_a_pod_still_prefilling_a_prompt_scores_below_one_that_is_not() -> None:
    busy = flying("busy", count=1, prompt=1000, prefilling=1000)
    decoding = flying("decoding", count=1, prompt=1000, prefilled_at=NOW - 1.0)
    low, high = scores(busy, decoding)
    assert high == 1.0
    # The busy pod's step carries 1,000 more prefill tokens: 17 ms on the default step model.
    decode = decode_step(1, 1000)
    own = decode + STEP.decode_sequence_s + STEP.context_token_s * PROMPT + STEP.prefill_token_s * PROMPT
    best = decode / 2 + own
    assert low == pytest.approx(best / (best + STEP.prefill_token_s * 1000))


def test_the_rest_of_the_step_the_engine_is_in_is_waited_out() -> None:
    """A first byte back from a pod ``age`` ago means its engine began a step then (about 5.9 ms
    here): the request waits for the rest of it. Long ago, or never seen, half a step on average."""
    assert decode_step(4, 2000) == pytest.approx(5.86e-3, abs=1e-5)
    ages = {"just": 0.0001, "early": 0.002, "late": 0.005, "old": 5.0}
    pods = [flying(n, count=4, prompt=2000, prefilled_at=NOW - age) for n, age in ages.items()]
    just, early, late, old = scores(*pods, flying("unseen", count=4, prompt=2000))[:4]
    unseen = scores(*pods, flying("unseen", count=4, prompt=2000))[4]
    assert just < early < old == unseen < late == 1.0


def test_a_first_byte_from_a_pod_whose_requests_have_ended_says_nothing_of_its_step() -> None:
    """Nothing of this EPP's in flight there, though others' requests run: half a step either way,
    so a pod that just answered one request at a time is not pushed down the fallback list."""
    answered = flying("answered", running=3, prefilled_at=NOW - 0.0005)
    other = flying("other", running=3)
    assert scores(answered, other) == [1.0, 1.0]


def test_a_pod_running_requests_of_others_is_not_idle() -> None:
    """Requests the EPP did not send (another replica's) keep the engine stepping: half a step to wait."""
    idle, others = flying("idle"), flying("others", running=3)
    assert scores(idle, others)[0] == 1.0
    assert scores(idle, others)[1] < 1.0


def test_a_cached_prefix_shortens_the_prefill() -> None:
    block_tokens = BLOCK_CHARS // 4
    request = dataclasses.replace(
        REQUEST,
        prefix_blocks=PROMPT // block_tokens,
        prefix_matches={pm("warm").pod.key: PROMPT // block_tokens},
    )
    warm, cold = scores(flying("warm"), flying("cold"), request=request)
    assert warm == 1.0
    base = STEP.base_s + STEP.decode_sequence_s + STEP.context_token_s * PROMPT
    assert cold == pytest.approx(base / (base + STEP.prefill_token_s * PROMPT))


def test_more_requests_and_context_in_flight_predict_a_longer_step() -> None:
    light = flying("light", count=2, prompt=500, prefilled_at=NOW - 1.0)
    heavy = flying("heavy", count=200, prompt=200_000, prefilled_at=NOW - 1.0)
    assert scores(light, heavy)[0] == 1.0
    assert scores(light, heavy)[1] < 0.8


def test_the_default_profile_keeps_a_burst_off_a_prefilling_pod() -> None:
    """Two requests a moment apart between scrapes: the first's prompt is still prefilling on its
    pod, so the second goes elsewhere, though the scraped figures are equal and equally fresh."""
    config = SchedulerConfig(kind=SCORER)
    assert config.weights.predicted_ttft > 0
    first = flying("first", count=1, prompt=PROMPT, prefilling=PROMPT)
    pods = [first, flying("second"), flying("third")]
    totals = CompiledProfile(config).totals(REQUEST, pods)
    assert totals[0] < totals[1] == totals[2]
    assert totals == total_scores(REQUEST, pods, config)


def test_at_weight_zero_only_the_in_flight_count_tells_the_pods_apart() -> None:
    config = SchedulerConfig(kind=SCORER, weights=ScorerWeights(predicted_ttft=0.0))
    first = flying("first", count=1, prompt=PROMPT, prefilling=PROMPT)
    totals = CompiledProfile(config).totals(REQUEST, [first, flying("second")])
    # Without it only the in-flight count tells them apart.
    in_flight = config.weights.in_flight
    assert totals[1] - totals[0] == pytest.approx(in_flight / 2)


def test_the_step_model_refuses_negative_or_infinite_costs() -> None:
    for bad in ({"base_s": 0.0}, {"prefill_token_s": -1e-6}, {"context_token_s": float("inf")}):
        with pytest.raises(ValueError, match="must be"):
            StepModel(**bad)  # type: ignore[arg-type]


def test_the_metrics_the_scorer_reads_are_only_the_running_count() -> None:
    """Scraped figures are up to an interval old; the prediction uses the EPP's own accounting, and
    of the scrape only whether the engine is running anything."""
    a = flying("a", count=1, prompt=100, prefilling=100)
    stale = dataclasses.replace(
        a, metrics=Metrics(waiting_queue_size=50, kv_cache_usage=0.99, updated_at=NOW)
    )
    assert scores(a, flying("b")) == scores(stale, flying("b"))


def test_where_no_prefill_is_seen_to_end_the_scorer_abstains() -> None:
    """Without the response body the EPP sees no first byte: every pod scores 0, so the profile
    decides as it would without the scorer, to the bit (the cached prefix alone would herd)."""
    blind = dataclasses.replace(
        REQUEST, prefills_observed=False, prefix_blocks=4, prefix_matches={pm("warm").pod.key: 4}
    )
    pods = [flying("warm"), flying("busy", count=3, prompt=900, prefilled_at=NOW - 0.001)]
    assert scores(*pods, request=blind) == [0.0, 0.0]
    assert scores(*pods) != [0.0, 0.0]
    config = SchedulerConfig(kind=SCORER)
    without = SchedulerConfig(kind=SCORER, weights=ScorerWeights(predicted_ttft=0.0))
    assert CompiledProfile(config).totals(blind, pods) == CompiledProfile(without).totals(blind, pods)
