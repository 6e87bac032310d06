"""``dsh acp``: an Agent Client Protocol agent on stdio, backed by the store and the agent loop.

An editor starts ``dsh acp [--provider … --model … --base-url …] [--tools read]`` and speaks
ACP on its stdin/stdout; diagnostics go to stderr. See :mod:`dsh.cli._acp` for the methods.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

import dsh
from dsh._install import install_hint
from dsh.cli._agent import (
    BaseUrlOption,
    ContextWindowOption,
    ModelOption,
    ProviderOption,
    SystemOption,
    TimeoutOption,
    Tools,
    ToolsOption,
    agent_options,
    model_settings,
    tools_for,
)
from dsh.cli._common import StoreOption, default_store_url, require_store, store_url

__all__ = ["acp"]


def acp(
    tools: ToolsOption = Tools.none,
    provider: ProviderOption = None,
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    system: SystemOption = None,
    timeout: TimeoutOption = 120.0,
    context_window: ContextWindowOption = None,
    store: StoreOption = None,
) -> None:
    """Run an Agent Client Protocol agent on stdio for an editor (Zed, JetBrains…).

    new, load, resume, fork, list, prompt and cancel work on the store's sessions
    (docs/standards.md).

    --tools read gives the model the read-only tools over each session's folder; shell
    commands are refused (an editor session has no terminal to approve them at).
    """
    import asyncio

    from dsh._errors import ConfigError, DshError

    try:
        from dsh.cli._acp import DshAcpAgent
    except ImportError as exc:
        raise ConfigError("dsh acp needs the agent-client-protocol package: "
                          f"{install_hint('acp')}", code="MISSING_EXTRA") from exc
    from dsh.agent.providers import create_provider

    provider, model, base_url = model_settings(provider, model, base_url)
    llm: Any = None
    unavailable: DshError | None = None
    try:
        llm = create_provider(provider, model=model, base_url=base_url, read_timeout_s=timeout)
    except DshError as exc:  # still answer initialize and list: an editor shows the reason
        unavailable = exc
        sys.stderr.write(f"dsh acp: no model until this is fixed: error[{exc.code}]: "
                         f"{exc.message}\n")

    def options(cwd: str) -> dict[str, Any]:
        choice = Tools.read if tools is Tools.shell else tools  # no terminal to approve at
        return agent_options(llm, system=system, tools=tools_for(choice, Path(cwd)),
                             context_window=context_window)

    url = store_url(store) if store else None
    opened: list[dsh.Store] = []

    def open_store(create: bool) -> dsh.Store | None:
        # docs/cli.md#stores-and-ids: only the first session written creates the store (and
        # DSH_HOME); a read of a store not there yet opens nothing
        if not opened:
            if not create:
                try:
                    require_store(url)
                except ConfigError as exc:
                    if exc.code != "STORE_NOT_FOUND":
                        raise
                    return None
            opened.append(dsh.open(url or default_store_url()))
        return opened[0]

    async def serve() -> None:
        from acp import run_agent

        from dsh.cli._acp import StdioTransport

        agent = DshAcpAgent(open_store, llm, options, unavailable=unavailable)
        try:
            await run_agent(cast(Any, agent), StdioTransport(), use_unstable_protocol=True)
        finally:
            await agent.close()
            if llm is not None:
                await llm.aclose()
            for sessions in opened:  # drains every live session to disk
                sessions.close()

    sys.stderr.write("dsh acp: speaking the Agent Client Protocol on stdin/stdout\n")
    asyncio.run(serve())
