"""Every Python snippet of docs/adapters.md runs, as written, against a local model server.

Each snippet defines its ``model`` (a real model name, on one ``model = ...`` line) and its
``get_weather`` tool; the test swaps that one line for the framework's OpenAI model class
pointed at a local server speaking the Chat Completions protocol, which answers a tool call
first and then text. Each runs in an empty folder with HOME and DSH_HOME of its own, and the
store must be the file its URL names there (``sqlite:sessions.db``: ``sessions.db`` in the
working folder; three slashes would have put it at the root).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import dsh
from tests.agent.providers.servers import Fail, ScriptedServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "adapters.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def completion(text: str = "", call: tuple[str, str] | None = None) -> Fail:
    """A whole (not streamed) Chat Completions answer: a 200 with the JSON body."""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if call is not None:
        message["tool_calls"] = [{"id": "call_w", "type": "function",
                                  "function": {"name": call[0], "arguments": call[1]}}]
    return Fail(200, {"id": "chatcmpl-doc", "object": "chat.completion",
                      "created": int(time.time()), "model": "gpt-test",
                      "choices": [{"index": 0, "message": message, "logprobs": None,
                                   "finish_reason": "tool_calls" if call else "stop"}],
                      "usage": {"prompt_tokens": 9, "completion_tokens": 3,
                                "total_tokens": 12}})


def model_for(snippet: str, base_url: str) -> Any:
    if "from agents import" in snippet:
        from agents import OpenAIChatCompletionsModel, set_tracing_disabled
        from openai import AsyncOpenAI
        set_tracing_disabled(True)
        return OpenAIChatCompletionsModel(
            model="gpt-test", openai_client=AsyncOpenAI(base_url=base_url, api_key="test"))
    if "pydantic_ai" in snippet:
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider
        return OpenAIChatModel("gpt-test", provider=OpenAIProvider(base_url=base_url,
                                                                   api_key="test"))
    from langchain_openai import ChatOpenAI
    return ChatOpenAI(model="gpt-test", base_url=base_url, api_key="test", max_retries=0)


def test_the_page_has_a_snippet_per_framework() -> None:
    text = "\n".join(SNIPPETS)
    for name in ("DshSession", "run_hooks()", "DshSaver.from_url", "saver.middleware()",
                 "wrap_tool_call=saver.wrap_tool_call", "DshChatMessageHistory",
                 "history.capability()", "DshConversationStore"):
        assert name in text


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index: int, tmp_path: Path) -> None:
    # each snippet runs in a fresh process, as a user's script would (the frameworks leave
    # their event loops and HTTP clients to the end of the process)
    snippet = SNIPPETS[index]
    with ScriptedServer() as server:
        uses_tools = "get_weather" in snippet
        if uses_tools:
            server.add(completion(call=("get_weather", '{"city": "Paris"}')))
        server.add(completion("Done."))
        work, home = tmp_path / "work", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HOME": str(home),
               "DSH_HOME": str(home / ".dsh")}
        proc = subprocess.run([sys.executable, "-m", "tests.adapters.test_docs_snippets",
                               str(index), server.base_url + "/v1"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        if "from agents import" in snippet or "pydantic_ai" in snippet or uses_tools:
            assert len(server.requests) == (2 if uses_tools else 1)
    # the store is where the snippet's URL says, relative to the working folder
    named = set(re.findall(r'"sqlite:([^"]*)"', snippet))
    assert named and all(not name.startswith("/") for name in named), named
    stores = sorted(work.glob("*.db"))
    assert stores == sorted(work / name for name in named), "the snippet stored its session"
    assert list(home.iterdir()) == []  # nothing in the default store
    listed = dsh("ls", "--store", f"sqlite:///{stores[0]}")
    assert listed.strip()
    if uses_tools:
        session = re.search(r'"thread_id": "([^"]+)"', snippet)
        assert session is not None
        shown = dsh("show", session.group(1), "--store", f"sqlite:///{stores[0]}")
        assert "sunny in Paris" in shown and "get_weather" in shown


if __name__ == "__main__":  # the child: run snippet N with the model at BASE_URL
    number, base_url = int(sys.argv[1]), sys.argv[2]
    code = SNIPPETS[number]
    # the snippet's own `model = ...` line names a real model; the local server stands in
    code, swapped = re.subn(r"^model = .*$", "model = local_model", code, flags=re.M)
    assert swapped == (1 if re.search(r"\bmodel\b", code) else 0), \
        "a snippet that uses a model defines it on one line"
    exec(compile(code, f"{DOC}:snippet {number}", "exec"),
         {"local_model": model_for(code, base_url), "__name__": "snippet"})
