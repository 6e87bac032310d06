"""Pydantic AI test helpers shared by the message-history and conversation-store tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel


def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sessions.db'}"


def weather_agent(model: Any) -> Agent[None, str]:
    agent = Agent(model, system_prompt="Answer in one line.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return f"{city}: 18 C"

    return agent


def scripted(replies: list[list[Any]]) -> FunctionModel:
    """A FunctionModel answering with the next scripted parts on each request."""
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=replies.pop(0), model_name="scripted")
    return FunctionModel(respond)
