"""The session header: identity and lineage that live beside the log, never inside it.

A :class:`SessionHeader` is a frozen JSON object (``version``, ``id``, ``createdAt`` and the
optional lineage fields) with snake_case properties. :func:`validate_header` applies the header
rules in their order, the first failure winning (docs/formats.md#the-session-header); unknown
extra keys are kept.
"""

from __future__ import annotations

import sys
from typing import Any, Final

from dsh._errors import EventRejectedError
from dsh.json import FrozenDict, is_safe_int
from dsh.session._events import SESSION_FORMAT_VERSION

HEADER_KEYS: Final = ("version", "id", "createdAt", "cwd", "parentSession", "seedLength",
                      "origin", "delegationDepth", "agentPreset")
"""The known header keys in dsh's header-line order (docs/formats.md#header-line)."""


class SessionHeader(FrozenDict):
    """A validated, frozen session header; the mapping is the wire JSON object.

    Attributes:
        version: Always ``SESSION_FORMAT_VERSION`` (0).
        id: The session id.
        created_at: Creation time, epoch ms.
        cwd: Absolute working directory, or None.
        parent_session: Lineage parent (fork or subagent), or None.
        seed_length: Events inherited through a fork seed, or None (not a fork child).
        origin: ``"subagent"`` or None.
        delegation_depth: Subagent depth; None means 0.
        agent_preset: Preset id, or None.

    Rule: docs/formats.md#the-session-header.
    """

    __slots__ = ()

    @property
    def version(self) -> int:
        """The format version (0)."""
        return self["version"]  # type: ignore[no-any-return]

    @property
    def id(self) -> str:
        """The session id."""
        return self["id"]  # type: ignore[no-any-return]

    @property
    def created_at(self) -> int:
        """Creation time in epoch milliseconds."""
        return self["createdAt"]  # type: ignore[no-any-return]

    @property
    def cwd(self) -> str | None:
        """Absolute working directory, or None."""
        return self.get("cwd")

    @property
    def parent_session(self) -> str | None:
        """Parent session id (fork or subagent lineage), or None."""
        return self.get("parentSession")

    @property
    def seed_length(self) -> int | None:
        """Number of leading events inherited through a fork seed, or None."""
        return self.get("seedLength")

    @property
    def origin(self) -> str | None:
        """``"subagent"`` or None."""
        return self.get("origin")

    @property
    def delegation_depth(self) -> int | None:
        """Subagent delegation depth, or None (meaning 0)."""
        return self.get("delegationDepth")

    @property
    def agent_preset(self) -> str | None:
        """Agent preset id, or None."""
        return self.get("agentPreset")

    def __repr__(self) -> str:
        return f"SessionHeader({dict.__repr__(self)})"


def _is_absolute_posix(path: str) -> bool:
    return path.startswith("/")


def _is_absolute_win32(path: str) -> bool:
    # Node's win32 isAbsolute: a leading separator (covers UNC), or drive letter + separator.
    if path[:1] in ("/", "\\"):
        return True
    return len(path) > 2 and path[0].isalpha() and path[0].isascii() and path[1] == ":" \
        and path[2] in ("/", "\\")


def is_absolute_path(path: str, *, platform: str | None = None) -> bool:
    """Return True when ``path`` is absolute under Node's ``path.isAbsolute`` rule.

    Args:
        path: The path text.
        platform: ``"win32"`` or any other value for POSIX; defaults to the host platform.

    Returns:
        POSIX: the path starts with ``/``. Windows: it starts with a slash or backslash (including
        UNC paths) or with a drive letter, ``:`` and a separator.

    Rule: docs/formats.md#the-session-header (Node's rule, not ``os.path.isabs``, which differs on
        Windows).
    """
    if (platform or sys.platform) == "win32":
        return _is_absolute_win32(path)
    return _is_absolute_posix(path)


def _fail(message: str, session_id: str) -> EventRejectedError:
    return EventRejectedError(message, code="HEADER", session_id=session_id)


def _is_count(value: object) -> bool:
    return is_safe_int(value) and value >= 0  # type: ignore[operator]  # is_safe_int: int


def validate_header(header: object, session_id: str) -> None:
    """Check a header against the header rules, in their order (first failure wins).

    Rule: docs/formats.md#the-session-header.

    Args:
        header: The candidate header (a ``dict``, ``FrozenDict`` or ``SessionHeader``).
        session_id: The id of the session the header belongs to.

    Raises:
        EventRejectedError: code ``HEADER``; the message names the first failing rule: not a plain
            JSON record, version, id mismatch, createdAt, cwd (type, then absolute), parentSession,
            seedLength, origin, delegationDepth, agentPreset.

    Rule: docs/formats.md#the-session-header.
    """
    if not isinstance(header, dict):
        raise _fail(f"session header is not a plain JSON record (found {type(header).__name__}) "
                    f"for session {session_id!r}", session_id)
    version = header.get("version")
    if type(version) is not int or version != SESSION_FORMAT_VERSION:
        raise _fail(f"session {session_id!r} header version is {version!r}; expected "
                    f"{SESSION_FORMAT_VERSION}", session_id)
    if header.get("id") != session_id or type(header.get("id")) is not str:
        raise _fail(f"header id {header.get('id')!r} does not match session id {session_id!r}",
                    session_id)
    if not _is_count(header.get("createdAt")):
        raise _fail(f"session {session_id!r} header createdAt must be a non-negative safe integer "
                    f"(found {header.get('createdAt')!r})", session_id)
    if "cwd" in header:
        cwd = header["cwd"]
        if type(cwd) is not str:
            raise _fail(f"session {session_id!r} header cwd must be a string (found "
                        f"{type(cwd).__name__})", session_id)
        if not is_absolute_path(cwd):
            raise _fail(f"session {session_id!r} header cwd must be an absolute path (found "
                        f"{cwd!r})", session_id)
    if "parentSession" in header and type(header["parentSession"]) is not str:
        raise _fail(f"session {session_id!r} header parentSession must be a string (found "
                    f"{header['parentSession']!r})", session_id)
    if "seedLength" in header and not _is_count(header["seedLength"]):
        raise _fail(f"session {session_id!r} header seedLength must be a non-negative safe "
                    f"integer (found {header['seedLength']!r})", session_id)
    if "origin" in header and header["origin"] != "subagent":
        raise _fail(f'session {session_id!r} header origin must be "subagent" (found '
                    f"{header['origin']!r})", session_id)
    if "delegationDepth" in header and not _is_count(header["delegationDepth"]):
        raise _fail(f"session {session_id!r} header delegationDepth must be a non-negative safe "
                    f"integer (found {header['delegationDepth']!r})", session_id)
    if "agentPreset" in header and type(header["agentPreset"]) is not str:
        raise _fail(f"session {session_id!r} header agentPreset must be a string (found "
                    f"{header['agentPreset']!r})", session_id)


def make_header(session_id: str, *, created_at: int, cwd: str | None = None,
                parent_session: str | None = None, seed_length: int | None = None,
                origin: str | None = None, delegation_depth: int | None = None,
                agent_preset: str | None = None) -> SessionHeader:
    """Build and validate a header; ``None`` fields are left out.

    Args:
        session_id: The session id.
        created_at: Creation time, epoch ms (non-negative).
        cwd: Absolute working directory.
        parent_session: Lineage parent id.
        seed_length: Events inherited through a fork seed.
        origin: ``"subagent"``.
        delegation_depth: Subagent depth.
        agent_preset: Preset id.

    Returns:
        A :class:`SessionHeader` with keys in :data:`HEADER_KEYS` order.

    Raises:
        EventRejectedError: code ``HEADER`` when a field breaks docs/formats.md#the-session-header.
    """
    values: tuple[Any, ...] = (SESSION_FORMAT_VERSION, session_id, created_at, cwd,
                               parent_session, seed_length, origin, delegation_depth,
                               agent_preset)
    header = {k: v for k, v in zip(HEADER_KEYS, values, strict=True) if v is not None}
    validate_header(header, session_id)
    return SessionHeader(header)

