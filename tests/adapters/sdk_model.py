"""A scripted OpenAI Agents SDK model for the adapter tests (no network).

Written for this project after the SDK's own test helpers (tests/fake_model.py and
tests/test_responses.py in openai/openai-agents-python): each call pops the next scripted
output list and records its input in ``last_turn_args``; streamed calls yield one
``response.completed`` event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


def text_message(text: str, msg_id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=msg_id, type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


def function_call(name: str, arguments: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", name=name, call_id=call_id,
                                    arguments=json.dumps(arguments), id=f"fc_{call_id}")


class ScriptedModel(Model):
    """Returns the scripted outputs in order; remembers every input it was sent."""

    def __init__(self) -> None:
        self.turns: list[list[Any]] = []
        self.inputs: list[list[Any]] = []
        self.last_turn_args: dict[str, Any] = {}

    def script(self, *outputs: list[Any]) -> None:
        self.turns.extend(outputs)

    def _next(self, input: Any) -> list[Any]:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        self.last_turn_args = {"input": input}
        if not self.turns:
            raise AssertionError("the scripted model has no output left")
        return self.turns.pop(0)

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                           previous_response_id: Any = None, conversation_id: Any = None,
                           prompt: Any = None) -> ModelResponse:
        return ModelResponse(output=self._next(input), usage=Usage(), response_id=None)

    async def stream_response(self, system_instructions: Any, input: Any, model_settings: Any,
                              tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                              previous_response_id: Any = None, conversation_id: Any = None,
                              prompt: Any = None) -> AsyncIterator[Any]:
        output = self._next(input)
        response = Response(id="resp_scripted", created_at=0, model="scripted",
                            object="response", output=output, tool_choice="auto", tools=[],
                            parallel_tool_calls=False, top_p=None)
        yield ResponseCompletedEvent(type="response.completed", response=response,
                                     sequence_number=0)
