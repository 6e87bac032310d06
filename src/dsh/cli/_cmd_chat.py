"""``dsh chat [ID]``: talk to a model in the terminal; every turn is a durable session log.

The answer streams as the log records it; tool calls and results show as one line each; a
``shell`` command runs only when you answer ``y``. Ctrl+C while the model works cancels the
turn (the log keeps what was streamed, marked interrupted); a second Ctrl+C, or Ctrl+C / Ctrl+D
at the prompt, ends the chat. ``dsh chat ID`` continues any stored session, including one
imported from Claude Code or Codex, on whichever provider you choose: its recent history is
shown first.

Commands at the prompt: ``/help`` (this list), ``/show [full]`` (the transcript so far),
``/fork [SEQ]`` (continue in a
child session that inherits events 0..SEQ, default all), ``/compact [model]`` (summarise
older history into a checkpoint now: the offline digest, or the chat's model), ``/exit``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from dsh._errors import DshError
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
    model_settings,
    open_agent,
    store_and_provider,
    tools_for,
)
from dsh.cli._common import (
    DEFAULT_WAIT_S,
    StoreOption,
    WaitOption,
    fresh_session_id,
    refuse_empty_id,
    refuse_unprintable_id,
    source_format,
    stderr_console,
)
from dsh.cli._errors import EXIT_FAILED
from dsh.cli._live import LiveView
from dsh.cli._render_entries import render_transcript, show_entries
from dsh.compaction import DigestSummarizer, acompact_now
from dsh.transcript import build as build_transcript

if TYPE_CHECKING:
    import asyncio

    from dsh import Store
    from dsh.agent import Agent


PROMPT: Final = "you> "
HISTORY_ITEMS: Final = 20
"""Transcript entries shown when a stored session is continued."""

_HELP: Final = ("commands: /help, /show [full], /fork [SEQ], /compact [model], /exit "
                 "(Ctrl+C cancels a turn)")
_COMMANDS: Final = (
    ("/help", "this list"),
    ("/show [full]", "the transcript so far (full: long tool results whole)"),
    ("/fork [SEQ]", "continue in a new session that inherits events 0..SEQ (default: all)"),
    ("/compact [model]", "summarise older history into a checkpoint now (offline digest, or "
                         "written by the chat's model)"),
    ("/exit", "leave (also Ctrl+D, or Ctrl+C twice at the prompt)"),
)


def chat(
    session: Annotated[str | None, typer.Argument(
        metavar="ID", show_default=False,
        callback=refuse_empty_id("give a whole session id, or none for a new session"),
        help="Session to continue (see `dsh ls`); default a new session.")] = None,
    tools: ToolsOption = Tools.none,
    provider: ProviderOption = None,
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    system: SystemOption = None,
    timeout: TimeoutOption = 120.0,
    context_window: ContextWindowOption = None,
    store: StoreOption = None,
    wait: WaitOption = DEFAULT_WAIT_S,
) -> None:
    """Chat with a model in the terminal; the conversation is a session you can resume."""
    import asyncio  # here: the CLI starts (`dsh ls`) without asyncio and the agent loop

    refuse_unprintable_id(session, "'ID'")
    settings = (*model_settings(provider, model, base_url), timeout)
    with store_and_provider(store, wait=wait, session_id=session, settings=settings,
                            provider_given=provider is not None) as (
            sessions, llm):
        options = agent_options(llm, system=system, tools=tools_for(tools, Path.cwd()),
                                context_window=context_window)
        loop = asyncio.new_event_loop()
        try:
            repl = _Chat(loop, sessions, llm, options)
            repl.main(session)
        finally:
            loop.run_until_complete(llm.aclose())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    if repl.last_failed:  # the last turn ended with an error (docs/cli.md#chat-with-your-own-key)
        raise typer.Exit(EXIT_FAILED)


class _Chat:
    """The read-eval-print loop over one event loop.

    The SDK client keeps its connections on that loop; prompts are read between turns, turns
    run on it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sessions: Store, llm: Any,
                 options: dict[str, Any]) -> None:
        self.loop = loop
        self.sessions = sessions
        self.llm = llm
        self.options = options
        self.err = sys.stderr
        self.agent: Agent | None = None
        self.pending: str | None = None
        self.stop_view: Callable[[], None] | None = None
        self.view = LiveView(sys.stdout, sys.stderr, color=sys.stderr.isatty())
        self.quit = False
        self.last_was_interrupt = False
        self.last_failed = False  # the last turn ended with an error: the chat exits 1

    def say(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()

    def attach(self, agent: Agent) -> None:
        if self.stop_view is not None:
            self.stop_view()
        self.agent = agent
        self.stop_view = agent.session.observe(self.view)

    def main(self, session_id: str | None) -> None:
        # Nothing is opened for writing until the first prompt, /fork or /compact: a chat
        # opened and left writes nothing and leaves LAST ACTIVITY as it was.
        self.pending = session_id or fresh_session_id(self.sessions)
        resumed = session_id is not None and self.sessions.exists(session_id)
        if resumed:
            self.show(HISTORY_ITEMS)
        self.say(f"session {self.pending} · {self.llm.name} {self.llm.model} · {_HELP}")
        while not self.quit:
            line = self.read()
            if line is None:
                break
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                self.command(text)
            else:
                self.turn(text)
        if self.stop_view is not None:
            self.stop_view()
        if self.agent is not None:
            self.say(f"bye · continue with: dsh chat {self.agent.session.id}")
        elif resumed:
            self.say(f"bye · nothing written · continue with: dsh chat {session_id}")
        else:
            self.say("bye · nothing written")

    @property
    def current(self) -> Agent:
        """The agent, opened (and its session resumed or created) on first use."""
        if self.agent is None:
            agent, _ = self.loop.run_until_complete(
                open_agent(self.sessions, self.llm, self.pending, options=self.options))
            self.attach(agent)
        assert self.agent is not None
        return self.agent

    def read(self) -> str | None:
        """One prompt line; None to end the chat (Ctrl+D, or a second Ctrl+C in a row)."""
        while True:
            try:
                line = input(PROMPT)
            except EOFError:
                self.say("")
                return None
            except KeyboardInterrupt:
                if self.last_was_interrupt:
                    self.say("")
                    return None
                self.last_was_interrupt = True
                self.say("\n(Ctrl+C again or /exit to quit)")
                continue
            self.last_was_interrupt = False
            return line

    def turn(self, prompt: str) -> None:
        import asyncio

        shown = self.view.failed_turns
        task = self.loop.create_task(self.current.run(prompt))
        presses = 0

        def on_interrupt() -> None:
            nonlocal presses
            presses += 1
            if presses == 1:
                task.cancel()
            else:
                self.quit = True  # leave once the cancelled turn is recorded

        self.loop.add_signal_handler(signal.SIGINT, on_interrupt)
        try:
            self.loop.run_until_complete(task)
        except asyncio.CancelledError:
            self.last_was_interrupt = True
            self.last_failed = False
        except DshError as error:  # the turn ended with it; the chat goes on
            self.last_failed = True
            if self.view.failed_turns == shown:  # not already said by a failed turn's line
                self.say(f"error[{error.code}]: {' '.join(error.message.split())}")
        else:
            self.last_failed = False
        finally:
            self.loop.remove_signal_handler(signal.SIGINT)
            self.view.close()
        if presses == 0:
            self.last_was_interrupt = False

    def command(self, text: str) -> None:
        name, _, rest = text.partition(" ")
        try:
            if name == "/exit":
                self.quit = True
            elif name in ("/help", "/?"):
                width = max(len(usage) for usage, _ in _COMMANDS)
                self.say("\n".join(f"  {usage.ljust(width)}  {what}"
                                   for usage, what in _COMMANDS)
                         + "\n  Ctrl+C while the model works cancels the turn")
            elif name == "/show":
                if rest.strip() not in ("", "full"):
                    self.say(f"/show takes nothing or 'full', got {rest.strip()!r}")
                    return
                self.show(None, full=rest.strip() == "full")
            elif name == "/fork":
                self.fork(rest.strip())
            elif name == "/compact":
                self.compact(rest.strip())
            else:
                self.say(f"unknown command {name}; {_HELP}")
        except DshError as error:
            self.say(f"error[{error.code}]: {' '.join(error.message.split())}")

    def show(self, last: int | None, *, full: bool = False) -> None:
        if self.agent is not None:
            header: Any = self.agent.session.header
            events = list(self.agent.session.events)
        elif self.pending is not None and self.sessions.exists(self.pending):
            read = self.sessions.read(self.pending)  # a cold read writes nothing
            header, events = read.header, list(read.events)
        else:
            self.say("nothing yet: the session starts with your first prompt")
            return
        items = show_entries(build_transcript(events, header=header))
        if last is not None:
            items = items[-last:]
        row = render.session_row(header, events, source_format=source_format(events))
        stderr_console().print(render_transcript(header, items, row=row, full=full,
                                                 more_hint="/show full shows all"))

    def fork(self, seq_text: str) -> None:
        if seq_text and not seq_text.isdigit():
            self.say(f"/fork takes a seq number (see /show), got {seq_text!r}")
            return
        parent = self.current.session
        child_id = self.sessions.fork(parent.id, int(seq_text) if seq_text else None,
                                      child_id=fresh_session_id(self.sessions))
        agent = self.loop.run_until_complete(
            self.sessions.agent(child_id, provider=self.llm, **self.options))
        self.attach(agent)
        child = agent.session
        self.say(f"forked {parent.id} at seq {(child.header.seed_length or 0) - 1} as {child.id}; "
                 f"now continuing {child.id}")

    def compact(self, how: str) -> None:
        if how not in ("", "model"):
            self.say(f"/compact takes nothing (offline digest) or 'model', got {how!r}")
            return
        session = self.current.session
        if how == "model":
            from dsh.agent.providers import provider_summarizer

            summarizer: Any = provider_summarizer(self.llm, provider_name=self.llm.name,
                                                  model=self.llm.model)
        else:
            summarizer = DigestSummarizer()

        async def flush() -> None:
            await self.sessions.aflush(session)

        result = self.loop.run_until_complete(
            acompact_now(session, summarizer=summarizer, flush=flush))
        if result is None:
            self.say("nothing to compact yet")
        else:
            self.say(f"compacted seqs {result.shadowed_range[0]}–{result.shadowed_range[1]} "
                     f"into one checkpoint ({result.shadowed_token_count} → "
                     f"{result.checkpoint_token_count} tokens)")
