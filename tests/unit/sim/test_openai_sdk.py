"""The official ``openai`` SDK accepts the simulator's answers: completions and chat, streamed and not."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from harness.sim import ModelServerSim, SimConfig, SimThread

CONFIG = SimConfig(model="base", lora_adapters=("a",), time_scale=0.001)


@pytest.fixture
def client(address: str) -> Iterator[openai.OpenAI]:
    with (
        SimThread(ModelServerSim(address, config=CONFIG)) as handle,
        openai.OpenAI(base_url=f"{handle.sim.base_url}/v1", api_key="unused", max_retries=0) as sdk,
    ):
        yield sdk


def test_completion(client: openai.OpenAI) -> None:
    result = client.completions.create(model="a", prompt="Say hello", max_tokens=6)
    assert result.object == "text_completion"
    assert result.model == "a"
    assert result.choices[0].finish_reason == "length"
    assert result.choices[0].text
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (
        3,
        6,
        9,
    )


def test_chat_completion(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "Say hello"}], max_tokens=4
    )
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content
    assert result.usage is not None
    assert result.usage.completion_tokens == 4


def test_streamed_completion_with_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="base", prompt="Say hello", max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5


def test_streamed_chat_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="a",
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (3, 5)


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["base", "a"]


def test_unknown_model_raises_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="missing", prompt="x")
    assert info.value.status_code == 404
    assert "The model `missing` does not exist." in str(info.value)
