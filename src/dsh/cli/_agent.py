"""What ``dsh run`` and ``dsh chat`` share: provider options, tools, building the agent.

Provider choice: ``--provider`` (default ``deepseek``), ``--model`` and ``--base-url`` override
the preset's defaults (:data:`dsh.agent.providers.PROVIDERS`); the key is read from the
preset's environment variable. ``--tools read`` gives the model the read-only workspace tools
over the current directory, ``--tools shell`` adds ``shell``, whose every command is put to the
person at the terminal first (refused when there is no terminal).

The agent loop, its tools and asyncio are imported by the functions that use them: the option
types here are read whenever the CLI starts (``dsh ls`` included).
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from dsh._errors import ConfigError, LlmFailureError, SessionNotFoundError
from dsh.agent.providers import PROVIDER_NAMES, create_provider
from dsh.cli._common import cli_store, fresh_session_id, store_missing, store_url

if TYPE_CHECKING:
    from dsh import Store
    from dsh.agent import Agent, ShellRequest, Tool


CONTEXT_WINDOWS: Final = {"deepseek": 128_000, "openai": 128_000, "anthropic": 200_000,
                          "openai-compatible": 32_768}
"""Context window assumed per ``--provider`` (tokens) when ``--context-window`` is not given;
compaction runs when a request nears it, or when the server says it overflowed."""


class Tools(enum.StrEnum):
    """``--tools``: what the model may use."""

    none = "none"
    read = "read"
    shell = "shell"


def _known_provider(name: str | None) -> str | None:
    """``--provider`` is one of the presets; anything else is a usage error (exit 2)."""
    if name is not None and name not in PROVIDER_NAMES:
        raise typer.BadParameter(f"unknown provider {name!r}; choose one of "
                                 f"{', '.join(PROVIDER_NAMES)}")
    return name


ProviderOption = Annotated[str | None, typer.Option(
    "--provider", metavar="NAME", callback=_known_provider, show_default=False,
    help=f"Model provider: {', '.join(PROVIDER_NAMES)} (default: $DSH_PROVIDER, else "
         "provider in $DSH_HOME/config.toml, else deepseek). Keys come from "
         "DEEPSEEK_API_KEY, OPENAI_API_KEY or ANTHROPIC_API_KEY.")]
ModelOption = Annotated[str | None, typer.Option(
    "--model", metavar="ID", show_default=False,
    help="Model id (default: $DSH_MODEL, else model in $DSH_HOME/config.toml, else per "
         "provider: deepseek-flash, gpt-5-mini, claude-sonnet-4-5).")]
BaseUrlOption = Annotated[str | None, typer.Option(
    "--base-url", metavar="URL", show_default=False,
    help="API root of an OpenAI-compatible server (vLLM, Ollama, OpenRouter) or a proxy "
         "(default: $DSH_BASE_URL, else base_url in $DSH_HOME/config.toml).")]

CONFIG_FILE: Final = "config.toml"
"""The settings file in the dsh home (``$DSH_HOME``, default ``~/.dsh``)."""
_SETTINGS: Final = (("provider", "DSH_PROVIDER"), ("model", "DSH_MODEL"),
                    ("base_url", "DSH_BASE_URL"))


def _config_file() -> dict[str, str]:
    """``provider``, ``model`` and ``base_url`` from ``$DSH_HOME/config.toml`` (if it exists).

    Raises:
        ConfigError: code ``CONFIG_INVALID``: not TOML, or a value that is not a string, or a
            key dsh does not know (the message names the file and the key).
    """
    import tomllib

    from dsh.cli._common import dsh_home

    path = dsh_home() / CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", code="CONFIG_INVALID",
                          path=str(path)) from exc
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); fix it or remove it",
                          code="CONFIG_INVALID", path=str(path)) from exc
    known = {key for key, _ in _SETTINGS}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{path}: unknown setting {key!r}; dsh reads "
                              f"{', '.join(sorted(known))}", code="CONFIG_INVALID",
                              path=str(path))
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{path}: {key} must be a non-empty string, got {value!r}",
                              code="CONFIG_INVALID", path=str(path))
    return {key: str(value) for key, value in values.items()}


def model_settings(provider: str | None, model: str | None,
                   base_url: str | None) -> tuple[str, str | None, str | None]:
    """The provider, model and base URL a ``dsh run``/``chat``/``acp`` uses.

    Rule (docs/cli.md#settings): each comes from its option, else its environment variable
    (``DSH_PROVIDER``, ``DSH_MODEL``, ``DSH_BASE_URL``), else ``$DSH_HOME/config.toml``
    (``provider``, ``model``, ``base_url``), else the provider's preset (provider
    ``deepseek``). A model or base URL set for one provider is not carried to another: when
    ``--provider`` names a provider other than the configured one, the configured model and
    base URL are not used.

    Raises:
        ConfigError: code ``CONFIG_INVALID`` for a bad config file or an unknown provider in
            the environment or the file.
    """
    import os

    given = {"provider": provider, "model": model, "base_url": base_url}
    configured: dict[str, tuple[str, str]] = {}  # key -> (value, where)
    for key, value in _config_file().items():
        configured[key] = (value, "config.toml")
    for key, variable in _SETTINGS:
        if os.environ.get(variable):
            configured[key] = (os.environ[variable], variable)
    if "provider" in configured and configured["provider"][0] not in PROVIDER_NAMES:
        value, where = configured["provider"]
        raise ConfigError(f"unknown provider {value!r} in {where}; choose one of "
                          f"{', '.join(PROVIDER_NAMES)}", code="CONFIG_INVALID")
    chosen = provider or (configured["provider"][0] if "provider" in configured
                          else "deepseek")
    own = configured.get("provider", ("deepseek", ""))[0] == chosen
    out = {key: given[key] or (configured[key][0] if key in configured and own else None)
           for key in ("model", "base_url")}
    return chosen, out["model"], out["base_url"]
ToolsOption = Annotated[Tools, typer.Option(
    "--tools", help="Tools for the model: read (read-only, current directory) or shell "
                    "(read + shell commands you approve).")]
SystemOption = Annotated[str | None, typer.Option(
    "--system", metavar="TEXT", show_default=False, help="System prompt.")]
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", metavar="SECONDS", min=0.1,
    help="Give up on a model call after this many seconds without data (it is retried).")]
ContextWindowOption = Annotated[int | None, typer.Option(
    "--context-window", metavar="TOKENS", min=1024, show_default=False,
    help="The model's context window (default per provider); compaction keeps requests "
         "under it.")]


async def ask_line(prompt: str) -> str:
    """Ask the person at the terminal for one line without blocking the event loop.

    Returns '' at end of input.
    """
    import asyncio

    sys.stderr.write(prompt)
    sys.stderr.flush()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()
    fd = sys.stdin.fileno()

    def ready() -> None:
        if not done.done():
            done.set_result(sys.stdin.readline())

    loop.add_reader(fd, ready)
    try:
        return await done
    finally:
        loop.remove_reader(fd)


async def _approve_at_terminal(request: ShellRequest) -> bool:
    answer = await ask_line(f"run shell command in {request.cwd}?\n  $ {request.command}\n"
                            f"[y/N] ")
    return answer.strip().lower() in ("y", "yes")


def tools_for(choice: Tools, root: Path) -> list[Tool]:
    """The tools of ``--tools choice`` over ``root`` (shell approval at the terminal)."""
    from dsh.agent import ShellApproval, refuse_all, shell_tool, workspace_tools

    if choice is Tools.none:
        return []
    tools = workspace_tools(root)
    if choice is Tools.shell:
        approve: ShellApproval
        if sys.stdin.isatty():
            approve = _approve_at_terminal
        else:
            approve = refuse_all
            sys.stderr.write("note: stdin is not a terminal, so no shell command can be "
                             "approved: each one the model asks for is refused (NOT_APPROVED)\n")
        tools.append(shell_tool(root, approve=approve))
    return tools


def check_id_syntax(session_id: str) -> None:
    """Refuse a session name no store can hold, before any store is opened.

    Raises:
        ConfigError: code ``INVALID_ID`` (``session_id_problem``).
    """
    from dsh.persistence import session_id_problem

    if (problem := session_id_problem(session_id)) is not None:
        raise ConfigError(f"session id {session_id!r} cannot name a stored session: {problem}",
                          code="INVALID_ID", session_id=session_id)


def check_new_session_id(store: Store, session_id: str) -> None:
    """Refuse a session name no store can hold, or that is no stored id but the start of some.

    ``dsh run --session`` and ``dsh chat ID`` call it before the provider is made (its key
    read) or asked anything, so a bad id is reported first (docs/cli.md#stores-and-ids).

    Rule: docs/cli.md#stores-and-ids (a command that writes names its session exactly).

    Raises:
        ConfigError: code ``INVALID_ID``, an id no store can hold (``session_id_problem``).
        SessionNotFoundError: code ``SESSION_ID_PREFIX``, naming the sessions it starts.
    """
    check_id_syntax(session_id)
    if store.exists(session_id):
        return
    matches = sorted(str(h["id"]) for h in store.persistence.list_headers()
                     if str(h["id"]).startswith(session_id))
    if matches:
        shown = ", ".join(matches[:5]) + (" …" if len(matches) > 5 else "")
        raise SessionNotFoundError(
            f"no session {session_id!r}, but it is the start of {shown}; a command that "
            f"writes takes the whole id: pass {matches[0]} to continue that one, "
            "or a name no stored id starts with for a new session",
            code="SESSION_ID_PREFIX", session_id=session_id)


_REFUSED: Final = {"AuthenticationError": "AUTHENTICATION",
                   "PermissionDeniedError": "PERMISSION_DENIED",
                   "APIConnectionError": "NETWORK"}
"""SDK errors of the model-list probe that mean no request of this run could succeed."""


async def check_reachable(llm: Any) -> None:
    """Before a new session is created: the provider's server answers and takes the key.

    Rule (docs/cli.md#settings): ``dsh run`` asks the provider's model list (no tokens spent,
    no retries) before it creates a session, so a refused key or a server it cannot reach
    ends the command with nothing written; any other answer (a server without a model list)
    lets the run go on, and the model call reports what is wrong.

    Raises:
        LlmFailureError: ``AUTHENTICATION``, ``PERMISSION_DENIED`` or ``NETWORK``.
    """
    client = getattr(llm, "client", None)
    with_options = getattr(client, "with_options", None)
    if with_options is None:
        return
    try:
        await with_options(max_retries=0).models.list()
    except Exception as exc:  # the SDK's own error classes, told apart by name below
        names = [klass.__name__ for klass in type(exc).__mro__]
        code = next((_REFUSED[name] for name in names if name in _REFUSED), None)
        if code is None:
            return
        what = ("the server cannot be reached" if code == "NETWORK"
                else "the server refused the key")
        raise LlmFailureError(
            f"{llm.name} model {llm.model}: {what} ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}); no session was created. Check "
            "--base-url and the key variable, then run the command again", code=code) from exc


async def open_agent(store: Store, provider: Any, session_id: str | None, *,
                     options: Mapping[str, Any]) -> tuple[Agent, bool]:
    """The agent for ``session_id``: resumed when stored (repaired first), else new.

    Rule: a command that writes names its session exactly (docs/cli.md#stores-and-ids): the id
    of a stored session continues it, a name no stored id starts with starts a new session
    with that id, and a name that is only a prefix of stored ids is refused, so a mistyped id
    never appends to (and commits the repair of) another session.

    Returns:
        ``(agent, resumed)``.

    Raises:
        SessionNotFoundError: ``SESSION_ID_PREFIX`` for a name that is a prefix of stored ids.
    """
    if session_id is not None:
        check_new_session_id(store, session_id)
    resumed = session_id is not None and store.exists(session_id)
    # A fresh id for a new session: ids minted by the store only avoid live sessions.
    agent = await store.agent(session_id or fresh_session_id(store), provider=provider,
                              **options)
    return agent, resumed


def _unset_provider_note() -> str:
    """Where a provider could have been set and was not, or '' when one was set there.

    Ends a ``MISSING_KEY`` for a provider no option chose: a person who wrote
    ``~/.dsh/config.toml`` while ``DSH_HOME`` names another folder learns which file was read
    (docs/cli.md#settings).
    """
    import os

    from dsh.cli._common import dsh_home

    if os.environ.get("DSH_PROVIDER") or "provider" in _config_file():
        return ""
    path = dsh_home() / CONFIG_FILE
    state = "sets no provider" if path.exists() else "does not exist"
    return f" (no provider was chosen: DSH_PROVIDER is unset and {path} {state})"


@contextmanager
def store_and_provider(url: str | None, *, wait: float, session_id: str | None,
                       settings: tuple[str, str | None, str | None, float],
                       provider_given: bool = True) -> Iterator[tuple[Store, Any]]:
    """The store and the provider of ``dsh run``/``dsh chat``, the session id given checked first.

    Rule (docs/cli.md#stores-and-ids): a bad id (``INVALID_ID``, ``SESSION_ID_PREFIX``) is the
    first error, before the key is read (``MISSING_KEY``) or the server asked (``NETWORK``);
    without an id, or with one when the store does not exist yet (it can then hold no session
    the id starts), the provider is made before the store is opened, so a missing key creates
    nothing (no store, no ``DSH_HOME``).

    Args:
        url: The ``--store`` URL, or None for the default store (:func:`cli_store`).
        wait: Seconds to wait for a busy session (``--wait``).
        session_id: The id given, or None.
        settings: ``(provider, model, base_url, read_timeout_s)`` (:func:`model_settings`).
        provider_given: Whether ``--provider`` was given; when not, a ``MISSING_KEY`` also
            says that neither ``DSH_PROVIDER`` nor ``$DSH_HOME/config.toml`` chose one.

    Yields:
        ``(store, provider)``; the store is closed after.

    Raises:
        ConfigError, SessionNotFoundError: from :func:`check_new_session_id`.
        ConfigError: ``MISSING_KEY`` and the like, from ``create_provider``.
    """
    provider, model, base_url, timeout = settings

    def make() -> Any:
        try:
            return create_provider(provider, model=model, base_url=base_url,
                                   read_timeout_s=timeout)
        except ConfigError as error:
            note = "" if provider_given or error.code != "MISSING_KEY" else _unset_provider_note()
            if not note:
                raise
            raise ConfigError(error.message + note, code="MISSING_KEY") from error

    if session_id is not None:
        check_id_syntax(session_id)
    fresh = session_id is None or store_missing(store_url(url) if url is not None else None)
    llm = make() if fresh else None  # else after the id is checked against the store
    with cli_store(url, wait=wait) as sessions:
        if session_id is not None and llm is None:
            check_new_session_id(sessions, session_id)
            llm = make()
        yield sessions, llm


def agent_options(provider: Any, *, system: str | None, tools: list[Tool],
                  context_window: int | None) -> dict[str, Any]:
    """The :class:`Agent` keyword options for a provider built by ``create_provider``."""
    return {"config": {"provider": provider.name, "model": provider.model}, "system": system,
            "tools": tools,
            "context_window": context_window or CONTEXT_WINDOWS.get(provider.name)}
