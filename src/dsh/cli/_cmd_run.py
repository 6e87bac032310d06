"""``dsh run "PROMPT"``: one turn of a real model, streamed, recorded in a session.

The answer streams to stdout as the log records it; reasoning, tool calls and retries go to
stderr. With ``--session ID`` a stored session is resumed (an interrupted turn is closed first)
and continued; otherwise a new session is created and its id printed on stderr.

Exit status is the turn's ``turn/end`` reason: 0 completed, 1 error (the one error line says
what failed), 3 max-tokens (the answer was cut at the token limit), 130 interrupted (Ctrl+C:
the log keeps what was streamed, marked interrupted).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from dsh.cli import _render as render
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
    check_reachable,
    model_settings,
    open_agent,
    store_and_provider,
    tools_for,
)
from dsh.cli._common import (
    DEFAULT_WAIT_S,
    JsonOption,
    StoreOption,
    WaitOption,
    json_mode,
    refuse_empty_id,
    refuse_unprintable_id,
)
from dsh.cli._live import LiveView

EXIT_MAX_TOKENS: Final = 3
"""Exit status of ``dsh run`` when the answer stopped at the model's token limit."""


def run_(
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="What to ask the model.",
                                          show_default=False)],
    session: Annotated[str | None, typer.Option(
        "--session", metavar="ID", show_default=False,
        callback=refuse_empty_id("give a whole session id, or leave --session out for a new "
                                 "session"),
        help="Continue this session (resumed and repaired first; created when new).")] = None,
    tools: ToolsOption = Tools.none,
    provider: ProviderOption = None,
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    system: SystemOption = None,
    timeout: TimeoutOption = 120.0,
    context_window: ContextWindowOption = None,
    store: StoreOption = None,
    wait: WaitOption = DEFAULT_WAIT_S,
    json_: JsonOption = False,
) -> None:
    """Ask a model one thing; the answer streams to stdout and the turn is logged.

    Exit status: 0 completed, 1 error, 3 stopped at the token limit, 130 interrupted.
    """
    import asyncio  # here: the CLI starts (`dsh ls`) without asyncio and the agent loop

    json_mode(json_)
    refuse_unprintable_id(session, "'--session'")
    settings = (*model_settings(provider, model, base_url), timeout)
    with store_and_provider(store, wait=wait, session_id=session, settings=settings,
                            provider_given=provider is not None) as (
            sessions, llm):
        options = agent_options(llm, system=system, tools=tools_for(tools, Path.cwd()),
                                context_window=context_window)
        outcome = asyncio.run(_run(sessions, llm, session, prompt, options, json_))
    if json_:
        render.write_json(outcome)
    kind = outcome["reason"].get("kind")
    if kind == "max-tokens":
        raise typer.Exit(EXIT_MAX_TOKENS)


async def _run(sessions: Any, llm: Any, session_id: str | None, prompt: str,
               options: dict[str, Any], json_: bool) -> dict[str, Any]:
    try:
        if session_id is None or not sessions.exists(session_id):
            await check_reachable(llm)  # a new session is created only for a model that answers
        agent, resumed = await open_agent(sessions, llm, session_id, options=options)
        live = agent.session
        sys.stderr.write(f"session {live.id}" + (" (resumed)\n" if resumed else "\n"))
        view = LiveView(sys.stdout, sys.stderr, color=sys.stderr.isatty(), answer=not json_)
        stop = live.observe(view)
        try:
            result = await agent.run(prompt)
        finally:
            stop()
            view.close()
    finally:
        await llm.aclose()
    return {"session": live.id, "turn": result.turn, "steps": result.steps,
            "reason": dict(result.reason), "text": result.text}
