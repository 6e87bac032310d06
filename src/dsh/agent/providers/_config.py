"""Which real provider to talk to: names, default models, base URLs and key variables.

``create_provider("deepseek")`` is what ``dsh run`` and ``dsh chat`` call for ``--provider``,
``--model`` and ``--base-url``. Keys come only from the environment (never from the command
line, where they would end up in shell history). The provider classes are imported by
:func:`create_provider` itself, so the CLI can name the presets without loading them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from dsh._errors import ConfigError

if TYPE_CHECKING:
    from dsh.agent.providers._anthropic import AnthropicProvider
    from dsh.agent.providers._openai_chat import OpenAIChatProvider


ProviderName = Literal["openai", "anthropic", "deepseek", "openai-compatible"]


@dataclass(frozen=True, slots=True)
class ProviderPreset:
    """Defaults of one ``--provider`` choice.

    Attributes:
        protocol: ``"openai"`` (Chat Completions) or ``"anthropic"`` (Messages).
        key_variable: Environment variable holding the API key.
        model: Default model id, or None when ``--model`` is required.
        base_url: Default API root, or None for the SDK's own (or, for ``openai-compatible``,
            required ``--base-url``).
        key_required: False for servers that need no key (local vLLM, Ollama).
    """

    protocol: Literal["openai", "anthropic"]
    key_variable: str
    model: str | None
    base_url: str | None
    key_required: bool = True


PROVIDERS: Final[dict[str, ProviderPreset]] = {
    "deepseek": ProviderPreset("openai", "DEEPSEEK_API_KEY", "deepseek-flash",
                               "https://api.deepseek.com"),
    "openai": ProviderPreset("openai", "OPENAI_API_KEY", "gpt-5-mini", None),
    "anthropic": ProviderPreset("anthropic", "ANTHROPIC_API_KEY", "claude-sonnet-4-5", None),
    "openai-compatible": ProviderPreset("openai", "OPENAI_API_KEY", None, None,
                                        key_required=False),
}
"""The ``--provider`` choices and their defaults (README "Chat with your own key")."""

PROVIDER_NAMES: Final = tuple(PROVIDERS)


def create_provider(name: str, *, model: str | None = None, base_url: str | None = None,
                    env: Mapping[str, str] | None = None, read_timeout_s: float = 120.0,
                    connect_timeout_s: float = 10.0) -> OpenAIChatProvider | AnthropicProvider:
    """Build the provider for ``--provider name [--model M] [--base-url U]``.

    Args:
        name: One of :data:`PROVIDER_NAMES`.
        model: Model id; default the preset's.
        base_url: API root; default the preset's.
        env: Where keys are read (default ``os.environ``).
        read_timeout_s: Seconds without data before a call fails (retryable).
        connect_timeout_s: Seconds to connect.

    Returns:
        An :class:`OpenAIChatProvider` (``deepseek`` replays reasoning on tool-call messages,
        as DeepSeek's thinking mode requires) or an :class:`AnthropicProvider`.

    Raises:
        ConfigError: unknown ``name`` (code ``PROVIDER``); no key in the preset's variable
            (code ``MISSING_KEY``, the message names the variable); ``openai-compatible``
            without ``base_url`` or ``model`` (code ``PROVIDER``); the SDK is not installed
            (code ``MISSING_EXTRA``).
    """
    preset = PROVIDERS.get(name)
    if preset is None:
        raise ConfigError(f"unknown provider {name!r}; choose one of "
                          f"{', '.join(PROVIDER_NAMES)}", code="PROVIDER")
    env = os.environ if env is None else env
    base_url = base_url or preset.base_url
    model = model or preset.model
    if name == "openai-compatible" and not base_url:
        raise ConfigError("--provider openai-compatible needs --base-url, e.g. "
                          "http://127.0.0.1:11434/v1 for Ollama", code="PROVIDER")
    if model is None:
        raise ConfigError(f"--provider {name} needs --model (the server's model id)",
                          code="PROVIDER")
    key = env.get(preset.key_variable, "").strip()
    if not key:
        if preset.key_required:
            others = ", ".join(p for p in PROVIDER_NAMES if p != name)
            raise ConfigError(f"no API key for --provider {name}: set {preset.key_variable}, "
                              f"or choose another provider with --provider ({others}; "
                              "openai-compatible with --base-url needs no key)",
                              code="MISSING_KEY")
        key = "not-needed"  # local servers ignore the key, the SDK insists on one
    if preset.protocol == "anthropic":
        from dsh.agent.providers._anthropic import AnthropicProvider
        return AnthropicProvider(model=model, api_key=key, base_url=base_url, name=name,
                                 read_timeout_s=read_timeout_s,
                                 connect_timeout_s=connect_timeout_s)
    from dsh.agent.providers._openai_chat import OpenAIChatProvider
    return OpenAIChatProvider(
        model=model, api_key=key, base_url=base_url, name=name,
        reasoning_replay="tool-calls" if name == "deepseek" else "never",
        max_tokens_field="max_completion_tokens" if name == "openai" else "max_tokens",
        read_timeout_s=read_timeout_s, connect_timeout_s=connect_timeout_s)
