"""``import dsh`` (and the agent packages) must not import the provider SDKs, nor asyncio."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import dsh.agent
import dsh.agent.providers
from dsh.agent.providers import _anthropic as anthropic
from dsh.agent.providers import _openai_chat as openai_chat
from dsh.agent.providers import _summarizer as summarizer

HEAVY = ("asyncio", "anthropic", "openai", "httpx", "httpx2", "dsh.agent._loop",
         "dsh.agent.providers._anthropic", "dsh.interop", "filelock", "rich")


def imported_after(code: str, modules: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of ``modules`` a fresh interpreter holds after running ``code``."""
    probe = (f"import json, sys; {code}; "
             f"print(json.dumps(sorted(set({modules!r}) & sys.modules.keys())))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    return list(json.loads(out.stdout))


def test_import_dsh_imports_no_provider_sdk_and_no_asyncio() -> None:
    assert imported_after("import dsh, dsh.agent, dsh.agent.providers") == []


def test_the_first_use_of_a_lazy_name_loads_its_module() -> None:
    assert imported_after("import dsh.agent; dsh.agent.Agent") == ["asyncio", "dsh.agent._loop"]
    assert "dsh.agent.providers._anthropic" in imported_after(
        "from dsh.agent.providers import AnthropicProvider")


def test_lazy_exports_are_the_defining_modules_objects() -> None:
    for name in dsh.agent.__all__:
        assert name in dir(dsh.agent)
        obj = getattr(dsh.agent, name)
        if name not in ("AgentError", "LlmFailureError"):
            assert getattr(sys.modules[dsh.agent._LAZY[name]], name) is obj, name
    providers = dsh.agent.providers
    assert providers.AnthropicProvider is anthropic.AnthropicProvider
    assert providers.OpenAIChatProvider is openai_chat.OpenAIChatProvider
    assert providers.ReasoningReplay is openai_chat.ReasoningReplay
    assert providers.openai_usage is openai_chat.openai_usage
    assert providers.provider_summarizer is summarizer.provider_summarizer
    assert [n for n in providers.__all__ if n not in dir(providers)] == []
    for package in (dsh.agent, providers):
        with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
            getattr(package, "NoSuchName")  # noqa: B009
