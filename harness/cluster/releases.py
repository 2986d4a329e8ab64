"""The releases of upstream's API module whose CRDs the harness installs, and the API generation each
one speaks.

Two generations (DESIGN.md §1): **v1alpha2** (v0.3.0: InferencePool and InferenceModel in
``inference.networking.x-k8s.io``) and **v1** (v1.0.0 on: InferencePool GA in
``inference.networking.k8s.io``, with the optional InferenceObjective and InferenceModelRewrite in
``inference.networking.x-k8s.io/v1alpha2``). v1.6.0 ships only the pool CRDs: the objective and
rewrite APIs moved out with the EPP (to llm-d-router), whose clusters still serve them. A cluster set
up from v1.6.0 therefore gets them from v1.5.0, the last release that has them, and the harness says
so (``supplement_note``). Facts: ../shared/reference/upstream-v1.md §0, §a.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from epp.api.types import V1_GROUP, V1_VERSION, V1ALPHA2_GROUP, V1ALPHA2_VERSION

DEFAULT_CRD_RELEASE: Final = "v0.3.0"
CRD_RELEASE_ENV: Final = "EPP_HARNESS_CRD_RELEASE"
RELEASES: Final = ("v0.3.0", "v1.0.0", "v1.1.0", "v1.2.0", "v1.3.0", "v1.4.0", "v1.5.0", "v1.6.0")
# The newest release that still ships InferenceObjective and InferenceModelRewrite.
LAST_WITH_OBJECTIVES: Final = "v1.5.0"


@dataclass(frozen=True)
class Generation:
    """Where one API generation keeps its kinds."""

    name: str
    pool_group: str
    pool_version: str
    # The kinds that say how a request's model is served: InferenceModel (v1alpha2) or
    # InferenceObjective + InferenceModelRewrite (v1), all in the x-k8s group at v1alpha2.
    model_kinds: tuple[str, ...]
    # The subsystem of an EPP's per-request metrics: v0.3.0's ``inference_model``, v1.1.0 on
    # ``inference_objective`` (``inference_objective_request_error_total{model_name,...}``).
    request_metrics: str
    # The example a user applies with kubectl (a Deployment of simulators, its pool and models).
    example_manifest: str

    @property
    def pool_api_version(self) -> str:
        return f"{self.pool_group}/{self.pool_version}"

    @property
    def model_plurals(self) -> tuple[str, ...]:
        """The resources of ``model_kinds`` (``inferencemodels``; ``inferenceobjectives``, ...)."""
        return tuple(f"{kind.lower()}s" for kind in self.model_kinds)


# InferenceModel (v1alpha2 clusters), InferenceObjective and InferenceModelRewrite (v1 clusters). The
# groups and versions are the EPP's own (`epp.api.types`, the one place they are spelled).
MODEL_KINDS_GROUP: Final = V1ALPHA2_GROUP
MODEL_KINDS_VERSION: Final = V1ALPHA2_VERSION
MODEL_KINDS_API_VERSION: Final = f"{MODEL_KINDS_GROUP}/{MODEL_KINDS_VERSION}"
# The CRD files of the optional kinds, as upstream names them (<group>_<plural>.yaml).
OPTIONAL_KIND_FILES: Final = (
    f"{MODEL_KINDS_GROUP}_inferenceobjectives.yaml",
    f"{MODEL_KINDS_GROUP}_inferencemodelrewrites.yaml",
)

V1ALPHA2: Final = Generation(
    "v1alpha2",
    MODEL_KINDS_GROUP,  # v1alpha2's pool lives beside its models
    MODEL_KINDS_VERSION,
    ("InferenceModel",),
    "inference_model",
    "examples/cluster/vllm-sim.yaml",
)
V1: Final = Generation(
    "v1",
    V1_GROUP,
    V1_VERSION,
    ("InferenceObjective", "InferenceModelRewrite"),
    "inference_objective",
    "examples/cluster/vllm-sim-v1.yaml",
)


class UnknownReleaseError(ValueError):
    """A release the harness does not know the generation of."""


def check_release(release: str) -> str:
    """``release`` itself when the harness knows it; else ``UnknownReleaseError`` listing what it takes."""
    if release not in RELEASES:
        raise UnknownReleaseError(
            f"unknown CRD release {release!r}: the harness installs the CRDs of {', '.join(RELEASES)}"
        )
    return release


def default_release() -> str:
    """``$EPP_HARNESS_CRD_RELEASE`` or the pinned default (read at call time, never at import)."""
    return check_release(os.environ.get(CRD_RELEASE_ENV) or DEFAULT_CRD_RELEASE)


def generation_of(release: str) -> Generation:
    """The API generation a cluster set up from ``release``'s CRDs speaks."""
    return V1ALPHA2 if check_release(release).startswith("v0.") else V1


def session_generation() -> Generation:
    """The generation of the session's CRD release (``default_release``; the pytest plugin's
    ``--crd-release`` sets it for the whole run): what builders render and oracles read by default."""
    return generation_of(default_release())


def supplement_release(release: str) -> str | None:
    """The release the optional kinds come from when ``release`` no longer ships them, else None."""
    return LAST_WITH_OBJECTIVES if _newer(check_release(release), LAST_WITH_OBJECTIVES) else None


def supplement_note(release: str) -> str | None:
    """What the harness says when it takes kinds from another release (None when it does not)."""
    other = supplement_release(release)
    if other is None:
        return None
    return (
        f"CRD release {release} ships no InferenceObjective or InferenceModelRewrite (they moved with "
        f"the EPP to llm-d-router); installing them from {other}, the last release that has them"
    )


def _newer(a: str, b: str) -> bool:
    return _version(a) > _version(b)


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.removeprefix("v").split("."))
