"""Real model providers behind the agent loop: OpenAI-compatible Chat Completions and Anthropic.

Each sits on its official SDK, imported only when a provider is created (extras
``dsh-session[openai]`` and ``dsh-session[anthropic]``), so ``import dsh`` stays light.
"""

from __future__ import annotations

from dsh.agent.providers.anthropic import AnthropicProvider
from dsh.agent.providers.config import (
    PROVIDER_NAMES,
    PROVIDERS,
    ProviderName,
    ProviderPreset,
    create_provider,
)
from dsh.agent.providers.openai_chat import OpenAIChatProvider, ReasoningReplay, openai_usage
from dsh.agent.providers.summarizer import provider_summarizer

__all__ = [
    "PROVIDERS",
    "PROVIDER_NAMES",
    "AnthropicProvider",
    "OpenAIChatProvider",
    "ProviderName",
    "ProviderPreset",
    "ReasoningReplay",
    "create_provider",
    "openai_usage",
    "provider_summarizer",
]
