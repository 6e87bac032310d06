"""Real model providers behind the agent loop: OpenAI Chat Completions, OpenAI Responses, Anthropic.

Each sits on its official SDK, imported only when a provider is created (extras
``dsh-session[openai]`` and ``dsh-session[anthropic]``), so ``import dsh`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh._lazy import lazy_exports
from dsh.agent.providers._config import (
    PROVIDER_NAMES,
    PROVIDERS,
    ProviderName,
    ProviderPreset,
    create_provider,
)

if TYPE_CHECKING:
    from dsh.agent.providers._anthropic import AnthropicProvider
    from dsh.agent.providers._openai_chat import OpenAIChatProvider, ReasoningReplay, openai_usage
    from dsh.agent.providers._openai_responses import (
        OpenAIResponsesProvider,
        responses_input,
        responses_usage,
    )
    from dsh.agent.providers._summarizer import provider_summarizer

__all__ = [
    "PROVIDERS",
    "PROVIDER_NAMES",
    "AnthropicProvider",
    "OpenAIChatProvider",
    "OpenAIResponsesProvider",
    "ProviderName",
    "ProviderPreset",
    "ReasoningReplay",
    "create_provider",
    "openai_usage",
    "provider_summarizer",
    "responses_input",
    "responses_usage",
]

# PEP 562: the provider classes load on first use (they pull the agent loop's provider protocol
# and dsh.interop's exporters); the presets above are what `dsh --help` needs.
_LAZY: dict[str, str] = {
    "AnthropicProvider": "dsh.agent.providers._anthropic",
    "OpenAIChatProvider": "dsh.agent.providers._openai_chat",
    "ReasoningReplay": "dsh.agent.providers._openai_chat",
    "openai_usage": "dsh.agent.providers._openai_chat",
    "provider_summarizer": "dsh.agent.providers._summarizer",
    "OpenAIResponsesProvider": "dsh.agent.providers._openai_responses",
    "responses_input": "dsh.agent.providers._openai_responses",
    "responses_usage": "dsh.agent.providers._openai_responses",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
