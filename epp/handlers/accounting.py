"""What the EPP remembers about the requests it routes: in flight per pod, and prefixes per pod.

Kept apart from the stream state machine on purpose: a stream calls four methods and knows nothing
else. The memory itself lives in the datastore (the only mutable shared state, STYLE habit 2).

When a request ends. Envoy keeps a request's ext_proc stream open until the HTTP stream is over
(measured with Envoy 1.40: the gRPC stream reaches end-of-stream when the last response byte has gone
to the client, whatever the response processing mode, and also on a client reset), so the end of the
stream — ``ExtProcStream.close`` — is when a routed request stops counting as in flight. No response
phase has to be sent to the EPP for it: the default processing mode (response headers SKIP, body
NONE) costs nothing extra per request.

When a prompt is prefilled. A model server sends the first byte of a response once the engine step
that prefilled the prompt ends (streamed: the first token; not streamed: the whole answer). Where the
EPP is sent response bodies (v1's FULL_DUPLEX_STREAMED), the first chunk — ``first_byte`` — ends the
request's prefill on its pod. Where it is not (Envoy's protocol_config says response body NONE, or
says nothing), no prefill is counted for the request at all, only its prompt as context: one counted
until the stream ends would make a pod look busy for the whole of every decode.

When a prefix is cached. A model server reuses a prompt's blocks only once a step has computed them
(vLLM's prefix cache holds computed blocks), so where the first byte is reported the prompt's block
hashes join the pod's prefix index then, not when the request is routed: a follow-up sent while its
predecessor is still being prefilled would find nothing cached on that pod, and counting it as cached
sent it there to prefill its whole prompt behind the other (measured in virtual time, prefix-heavy at
64 engines: the slowest tenth of the turns sent back to their history's pod found 26% of the prompt
cached where the index promised 92%; README "Virtual time"). Where it is not reported, routing is the
only moment there is, as upstream records it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from epp.api.types import EndpointKey
from epp.config import CHARS_PER_TOKEN, DEFAULT_PREFIX_BLOCK_CHARS, DEFAULT_PREFIX_MAX_BLOCKS
from epp.datastore.types import PodMetrics
from epp.scheduling.filters import NO_MATCHES
from epp.scheduling.prefix import block_hashes


class RoutingMemory(Protocol):
    """The datastore's routing-memory methods (the Datastore Protocol satisfies it)."""

    def pod_dispatch_started(
        self, key: EndpointKey, target_model: str, prompt_tokens: int = 0, prefilling: bool = True
    ) -> bool: ...

    def pod_prefill_done(self, key: EndpointKey, prompt_tokens: int, at: float) -> None: ...

    def pod_dispatch_finished(
        self, key: EndpointKey, target_model: str, prompt_tokens: int = 0, prefilled: bool = True
    ) -> None: ...

    def prefix_matches(self, hashes: Sequence[int]) -> Mapping[EndpointKey, int]: ...

    def prefix_record(self, key: EndpointKey, hashes: Sequence[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class PrefixQuery:
    hashes: tuple[int, ...] = ()
    matches: Mapping[EndpointKey, int] = field(default_factory=lambda: NO_MATCHES)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One routed request still counted in flight; handed back to `finished` exactly once.

    ``prompt_tokens`` is its prompt's estimated size; ``prefilled`` is set at the first response byte
    (`first_byte`): until then the pod counts the prompt as still to prefill. ``hashes``: the prompt's
    block hashes, recorded on the pod by `first_byte` (empty once recorded, or when routing did)."""

    pod: EndpointKey
    target_model: str
    prompt_tokens: int = 0
    prefilled: bool = False
    hashes: Sequence[int] = ()


NO_PREFIX = PrefixQuery()


def prompt_token_estimate(body_bytes: int) -> int:
    """A request's prompt tokens, estimated from its body's size: the prompt is nearly all of an
    OpenAI request's bytes, and tokenizing it here would cost more than routing it."""
    return body_bytes // CHARS_PER_TOKEN


class Accounting:
    """``prefix_query`` before scheduling, ``routed`` after, ``finished`` when the stream ends.

    ``memory=None`` keeps nothing (tests of the protocol alone); ``prefix_aware`` turns prompt
    hashing on (only worth its CPU when a scheduler scores prefixes). ``clock`` stamps first bytes
    and requests (`LLMRequest.received_at`): the scheduler's clock, monotonic seconds.
    """

    def __init__(
        self,
        memory: RoutingMemory | None,
        *,
        prefix_aware: bool,
        block_chars: int = DEFAULT_PREFIX_BLOCK_CHARS,
        max_blocks: int = DEFAULT_PREFIX_MAX_BLOCKS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self._memory = memory
        self._prefix_aware = prefix_aware and memory is not None
        self._block_chars = block_chars
        self._max_blocks = max_blocks

    def prefix_query(self, prompt: str, target_model: str) -> PrefixQuery:
        """`prompt` is the head of the prompt text (`ScannedBody.prompt_head`)."""
        if not self._prefix_aware or self._memory is None:
            return NO_PREFIX
        hashes = block_hashes(
            prompt, target_model, block_chars=self._block_chars, max_blocks=self._max_blocks
        )
        if not hashes:
            return NO_PREFIX
        return PrefixQuery(hashes, self._memory.prefix_matches(hashes))

    def routed(
        self,
        pod: PodMetrics,
        target_model: str,
        query: PrefixQuery,
        prompt_tokens: int = 0,
        first_byte_reported: bool = True,
    ) -> Dispatch | None:
        """`prompt_tokens`: the prompt's size (`prompt_token_estimate`), prefilling until `first_byte`
        when the response body will reach the EPP (`first_byte_reported`); otherwise counted as
        context only: a prefill nobody will report done would weigh on its pod to the very end. The
        prompt's prefix joins the pod's index at `first_byte` when it is reported, else now (module
        docstring)."""
        memory = self._memory
        if memory is None:
            return None
        key = pod.pod.key
        if not first_byte_reported:
            memory.prefix_record(key, query.hashes)
        if not memory.pod_dispatch_started(key, target_model, prompt_tokens, first_byte_reported):
            return None  # the pod left between the snapshot and now: nothing to count down later
        if not first_byte_reported:
            return Dispatch(key, target_model, prompt_tokens, prefilled=True)
        return Dispatch(key, target_model, prompt_tokens, hashes=query.hashes)

    def first_byte(self, dispatch: Dispatch) -> Dispatch:
        """The first response byte came back: the engine has prefilled the prompt, whose blocks it now
        holds. The dispatch to hand to `finished` from now on."""
        if dispatch.prefilled or self._memory is None:
            return dispatch
        self._memory.pod_prefill_done(dispatch.pod, dispatch.prompt_tokens, self.clock())
        if dispatch.hashes:
            self._memory.prefix_record(dispatch.pod, dispatch.hashes)
        return Dispatch(dispatch.pod, dispatch.target_model, dispatch.prompt_tokens, prefilled=True)

    def finished(self, dispatch: Dispatch) -> None:
        if self._memory is not None:
            self._memory.pod_dispatch_finished(
                dispatch.pod, dispatch.target_model, dispatch.prompt_tokens, dispatch.prefilled
            )

    def served_by(
        self,
        dispatch: Dispatch | None,
        pod: PodMetrics,
        target_model: str,
        query: PrefixQuery,
        prompt_tokens: int = 0,
        first_byte_reported: bool = True,
    ) -> Dispatch | None:
        """A fallback served the request ``dispatch`` counted on its pick: move it to ``pod``.

        The in-flight count goes with the request, and the prompt's prefix is remembered on the pod
        that really holds it now (where routing recorded it on the pick, that entry stays: the index
        forgets by age, not by request; where the first byte records it, the pick never gets one).
        ``prompt_tokens`` and ``first_byte_reported`` are what `routed` was given for the pick, used
        when the pick had left before it was counted (``dispatch`` None), so the fallback still
        carries the prompt's size.
        """
        if dispatch is None:
            return self.routed(pod, target_model, query, prompt_tokens, first_byte_reported)
        if dispatch.pod == pod.pod.key:
            return dispatch
        self.finished(dispatch)
        return self.routed(pod, target_model, query, dispatch.prompt_tokens, not dispatch.prefilled)


NO_ACCOUNTING = Accounting(None, prefix_aware=False)
