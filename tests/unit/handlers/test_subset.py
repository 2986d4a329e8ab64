"""The subset hint's pure part: every spelling of an entry, and which endpoints it allows."""

from __future__ import annotations

import pytest

from epp.handlers.subset import parse_subset

# (address, port) of the candidates each case is matched against.
CANDIDATES = [("10.0.0.1", 8000), ("10.0.0.2", 8000), ("10.0.0.2", 8001), ("fd00::1", 8000)]


@pytest.mark.parametrize(
    ("hint", "allowed"),
    [
        pytest.param("10.0.0.1", [("10.0.0.1", 8000)], id="string-ip-any-port"),
        pytest.param("10.0.0.2", [("10.0.0.2", 8000), ("10.0.0.2", 8001)], id="string-ip-every-port-of-it"),
        pytest.param("10.0.0.2:8001", [("10.0.0.2", 8001)], id="string-ip-port-that-port-only"),
        pytest.param(
            "10.0.0.1:8000,10.0.0.2:8001",
            [("10.0.0.1", 8000), ("10.0.0.2", 8001)],
            id="string-comma-list",
        ),
        pytest.param(
            " 10.0.0.1 , ,10.0.0.2:8000 ",
            [("10.0.0.1", 8000), ("10.0.0.2", 8000)],
            id="spaces-and-empty-items",
        ),
        pytest.param(
            ["10.0.0.1", "10.0.0.2:8001"], [("10.0.0.1", 8000), ("10.0.0.2", 8001)], id="list-of-strings"
        ),
        pytest.param(
            ["10.0.0.1,10.0.0.2:8000"], [("10.0.0.1", 8000), ("10.0.0.2", 8000)], id="list-item-with-commas"
        ),
        pytest.param("[fd00::1]:8000", [("fd00::1", 8000)], id="ipv6-bracketed-with-port"),
        pytest.param("[fd00::1]", [("fd00::1", 8000)], id="ipv6-bracketed-no-port"),
        pytest.param("fd00:0::0001", [("fd00::1", 8000)], id="ipv6-bare-other-spelling"),
        pytest.param("10.0.0.1:9999", [], id="ip-port-no-such-port"),
        pytest.param("10.0.0.9", [], id="no-such-ip"),
        pytest.param("", [], id="empty-string-allows-nothing"),
        pytest.param([], [], id="empty-list-allows-nothing"),
        pytest.param(
            "10.0.0.1:0,10.0.0.1:x,10.0.0.1:70000,[fd00::1", [], id="unusable-entries-allow-nothing"
        ),
    ],
)
def test_subset_allows(hint: str | list[str], allowed: list[tuple[str, int]]) -> None:
    subset = parse_subset(hint)
    assert [c for c in CANDIDATES if subset.allows(*c)] == allowed


def test_describe_names_the_subset_shortly() -> None:
    assert parse_subset("10.0.0.2:80,10.0.0.1,[fd00::1]:8").describe() == "10.0.0.1,10.0.0.2:80,[fd00::1]:8"
    assert parse_subset("").describe() == "(empty)"
    many = parse_subset(",".join(f"10.0.1.{i}" for i in range(20))).describe()
    assert many.endswith(",...")
    assert many.count(",") == 8


@pytest.mark.parametrize(("count", "cut"), [(8, False), (9, True)])
def test_describe_names_eight_entries_and_marks_only_more(count: int, cut: bool) -> None:
    described = parse_subset(",".join(f"10.0.1.{i}" for i in range(count))).describe()
    assert described.endswith(",...") is cut, described
    assert described.removesuffix(",...").count(",") == 7


def test_a_name_that_is_not_an_address_is_kept_lower_cased() -> None:
    assert parse_subset("Model-Server.Example:8000").endpoints == {("model-server.example", 8000)}


def test_a_bracket_closes_at_its_first_closing_bracket() -> None:
    subset = parse_subset("[fd00::1]]:8000")
    assert (subset.hosts, subset.endpoints) == (frozenset(), frozenset()), (
        "text after the bracket names nothing"
    )


def test_the_port_range_is_1_to_65535_and_brackets_need_an_address() -> None:
    subset = parse_subset("10.0.0.1:1,10.0.0.1:65535,10.0.0.1:65536,10.0.0.1:0,[]:8000,[],[fd00::2]x")
    assert subset.endpoints == {("10.0.0.1", 1), ("10.0.0.1", 65535)}
    assert subset.hosts == frozenset(), "an empty bracket or text after it names no address"
