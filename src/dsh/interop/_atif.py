"""ATIF (Agent Trajectory Interchange Format) trajectories: export a session, import one.

Export (:func:`to_atif`) walks the session's history (:mod:`dsh.interop._history`) into ATIF
steps, version :data:`ATIF_VERSION`:

* a ``system`` message → a ``system`` step; a ``user`` message → a ``user`` step (text as a
  string, images as ``ContentPart`` placeholders naming the attachment);
* an ``assistant`` message → an ``agent`` step: ``message`` its text, ``reasoning_content`` its
  reasoning text, ``tool_calls`` its calls (``arguments`` the parsed JSON object), ``model_name``,
  ``metrics`` from its usage (``prompt_tokens`` = input + cache read + cache write,
  ``cached_tokens`` = cache read, ``extra.cache_creation_tokens``);
* each tool result answering a call of the latest agent step, with no step in between, is one of
  that step's ``observation.results`` (``source_call_id`` = the call id: calls and observations
  reference each other as ATIF requires); any other result is a ``system`` step whose
  observation has no ``source_call_id`` (its ``extra`` names the call);
* a compaction's checkpoint message → a ``user`` step whose ``extra.dsh.shadows`` names the
  first and last message ids it replaced;
* subagent sessions (children) → ``subagent_trajectories`` (``trajectory_id`` = their id).

What ATIF has no field for is kept in ``extra.dsh`` (message ids, sources, and the exact content
blocks only when the ATIF fields would not give them back, e.g. a thinking signature), so
:func:`import_atif` of an export gives back the same model view. Import reads any ATIF
trajectory (a file without ``extra.dsh`` maps from the ATIF fields alone). Rule:
docs/standards.md#atif.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dsh._errors import ConfigError, ImportFormatError
from dsh._install import install_hint
from dsh.interop._common import (
    EventBuilder,
    ImportedSession,
    JsonObj,
    derived_id,
    note_line,
    read_json_document,
    stable_session_id,
    str_or_none,
    token_count,
)
from dsh.interop._history import (
    Entry,
    LogLike,
    block_text,
    history,
    iso_time,
    safe_numbers,
    usage_of,
)

FORMAT: Final = "atif"
ATIF_VERSION: Final = "ATIF-v1.8"
"""The ``schema_version`` dsh writes (the version the published ``atif`` models describe)."""

_AGENT_NAME: Final = "dsh"


def looks_like_atif(doc: object) -> bool:
    """True for a JSON document with an ATIF ``schema_version`` and a ``steps`` list."""
    return (isinstance(doc, dict) and isinstance(doc.get("schema_version"), str)
            and doc["schema_version"].startswith("ATIF-") and isinstance(doc.get("steps"), list))


# --- shared reconstruction (export compares with it; import uses it) ---------------------------


def _text_message(blocks: Sequence[Mapping[str, Any]]) -> str | list[JsonObj]:
    """A user/system message's ATIF ``message``: a string, or parts when it holds images."""
    if all(b.get("type") == "text" for b in blocks):
        return "".join(str(b.get("text", "")) for b in blocks)
    parts: list[JsonObj] = []
    for b in blocks:
        if b.get("type") == "text":
            parts.append({"type": "text", "text": str(b.get("text", ""))})
        elif b.get("type") == "image" and _image_source(b) is not None:
            parts.append({"type": "image", "source": _image_source(b)})
        else:
            parts.append({"type": "text", "text": _block_text(b)})
    return parts


def _image_source(block: Mapping[str, Any]) -> JsonObj | None:
    att = block.get("attachment")
    if not isinstance(att, Mapping):
        return None
    media = att.get("mediaType")
    if media not in ("image/jpeg", "image/png", "image/gif", "image/webp"):
        return None
    name = att.get("name") or att.get("attachmentId") or "image"
    return {"media_type": media, "path": f"attachments/{name}"}


def _block_text(block: Mapping[str, Any]) -> str:
    if block.get("type") in ("text", "image", "provider-raw"):
        return block_text(block)
    return json.dumps(dict(block), ensure_ascii=False, default=str)


def _blocks_of_message(message: object) -> list[JsonObj]:
    """The dsh blocks of an ATIF ``message`` (string or ContentPart list)."""
    if isinstance(message, str):
        return [{"type": "text", "text": message}] if message else []
    out: list[JsonObj] = []
    if isinstance(message, list):
        for part in message:
            if not isinstance(part, Mapping):
                continue
            if part.get("type") == "text":
                out.append({"type": "text", "text": str(part.get("text") or "")})
            else:  # an image or audio reference: the bytes are not in the trajectory
                source = part.get("source")
                path = source.get("path") if isinstance(source, Mapping) else None
                out.append({"type": "text", "text": f"[{part.get('type')} {path}]"})
    return out


def _arguments_object(arguments: object) -> tuple[JsonObj, str | None]:
    """A call's JSON-text arguments as an object, and the raw text when that loses it.

    A number no JSON reader of the trajectory keeps exactly (an integer beyond ±(2^53-1),
    which dsh's own import refuses, or ``NaN``/``Infinity``, which are not JSON) is written as
    its decimal text in the object, the exact arguments in the raw text.
    """
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    try:
        value = json.loads(text) if text else {}
        if not isinstance(value, dict):
            return {}, text
        safe = safe_numbers(value)
    except (ValueError, RecursionError):  # (nested deeper than the parse or the number walk)
        return {}, text
    return safe, None if safe is value and _arguments_text(value) == text else text


def _arguments_text(arguments: Mapping[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False) if arguments else "{}"


def _agent_blocks(step: Mapping[str, Any]) -> list[JsonObj]:
    """The dsh assistant blocks of an agent step: reasoning, text, then the calls."""
    out: list[JsonObj] = []
    reasoning = step.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out.append({"type": "reasoning", "text": reasoning})
    out.extend(_blocks_of_message(step.get("message")))
    for call in step.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        extra = call.get("extra") if isinstance(call.get("extra"), Mapping) else {}
        raw = extra.get("arguments_text") if isinstance(extra, Mapping) else None
        args = call.get("arguments")
        out.append({"type": "tool-call", "id": str(call.get("tool_call_id", "")),
                    "name": str(call.get("function_name", "")),
                    "arguments": raw if isinstance(raw, str) else _arguments_text(
                        args if isinstance(args, Mapping) else {})})
    return out


def _result_content(content: object) -> list[JsonObj]:
    if content is None:
        return []
    return _blocks_of_message(content)


def _result_block(call_id: str, result: Mapping[str, Any]) -> JsonObj:
    extra = result.get("extra") if isinstance(result.get("extra"), Mapping) else {}
    block: JsonObj = {"type": "tool-result", "toolCallId": call_id,
                      "content": _result_content(result.get("content"))}
    if isinstance(extra, Mapping) and extra.get("is_error") is True:
        block["isError"] = True
    else:
        block["isError"] = False
    return block


def _same(a: object, b: object) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True,
                                                                    default=str)


def _plain(value: Any) -> Any:
    """Frozen containers as plain JSON values (what pydantic and json accept)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# --- export -----------------------------------------------------------------------------------


def _metrics(usage: Mapping[str, int]) -> JsonObj | None:
    if not usage:
        return None
    cache_read = usage.get("cacheReadTokens", 0)
    cache_write = usage.get("cacheWriteTokens", 0)
    metrics: JsonObj = {
        "prompt_tokens": usage.get("inputTokens", 0) + cache_read + cache_write,
        "completion_tokens": usage.get("outputTokens", 0),
        "cached_tokens": cache_read}
    extra: JsonObj = {}
    if "cacheWriteTokens" in usage:
        extra["cache_creation_tokens"] = cache_write
    if "reasoningTokens" in usage:
        extra["reasoning_tokens"] = usage["reasoningTokens"]
    if extra:
        metrics["extra"] = extra
    if _usage_of_metrics(metrics) != dict(usage):
        metrics.setdefault("extra", {})["dsh_usage"] = dict(usage)
    return metrics


def _usage_of_metrics(metrics: Mapping[str, Any]) -> JsonObj | None:
    extra = metrics.get("extra") if isinstance(metrics.get("extra"), Mapping) else {}
    if isinstance(extra, Mapping) and isinstance(extra.get("dsh_usage"), Mapping):
        return dict(extra["dsh_usage"])
    prompt = token_count(metrics.get("prompt_tokens"))
    cached = token_count(metrics.get("cached_tokens"))
    write = token_count(extra.get("cache_creation_tokens")) if isinstance(extra, Mapping) else 0
    usage: JsonObj = {"inputTokens": max(prompt - cached - write, 0),
                      "outputTokens": token_count(metrics.get("completion_tokens"))}
    if cached:
        usage["cacheReadTokens"] = cached
    if isinstance(extra, Mapping) and "cache_creation_tokens" in extra:
        usage["cacheWriteTokens"] = write
    if isinstance(extra, Mapping) and "reasoning_tokens" in extra:
        usage["reasoningTokens"] = token_count(extra["reasoning_tokens"])
    return usage


class _Exporter:
    def __init__(self, log: LogLike) -> None:
        self.log = log
        self.steps: list[JsonObj] = []
        self.agent_step: JsonObj | None = None  # the latest step, when it is an agent step
        self.model: str | None = None
        self.totals = {"prompt": 0, "completion": 0, "cached": 0}

    def step(self, source: str, entry: Entry, message: Any) -> JsonObj:
        step: JsonObj = {"step_id": len(self.steps) + 1, "timestamp": iso_time(entry.time),
                         "source": source, "message": message}
        self.steps.append(step)
        self.agent_step = None
        return step

    def entry(self, entry: Entry) -> None:
        message = entry.message
        role = message.get("role")
        blocks = [b for b in message.get("content") or [] if isinstance(b, Mapping)]
        if role == "assistant":
            self.assistant(entry, blocks)
            return
        if blocks and all(b.get("type") == "tool-result" for b in blocks) and len(blocks) == 1:
            self.result(entry, blocks[0])
            return
        source = "system" if role == "system" else "user"
        step = self.step(source, entry, _text_message(blocks))
        dsh: JsonObj = {"id": message.get("id"), "source": _plain(message.get("source"))}
        if role not in ("system", "user"):
            dsh["role"] = role
        if entry.shadows is not None:
            dsh["shadows"] = list(entry.shadows)
            dsh["compaction"] = _compaction_of(self.log.events, entry)
        if not _same(_blocks_of_message(step["message"]), _plain(blocks)):
            dsh["content"] = _plain(blocks)
        step["extra"] = {"dsh": dsh}

    def assistant(self, entry: Entry, blocks: list[Mapping[str, Any]]) -> None:
        message = entry.message
        source = message.get("source") if isinstance(message.get("source"), Mapping) else {}
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        reasoning = "\n\n".join(str(b.get("text", "")) for b in blocks
                                if b.get("type") == "reasoning" and b.get("text"))
        step = self.step("agent", entry, text)
        model = str_or_none(source.get("model")) if isinstance(source, Mapping) else None
        if model:
            step["model_name"] = model
            self.model = model
        if reasoning:
            step["reasoning_content"] = reasoning
        calls: list[JsonObj] = []
        for b in blocks:
            if b.get("type") != "tool-call":
                continue
            args, raw = _arguments_object(b.get("arguments", ""))
            call: JsonObj = {"tool_call_id": str(b.get("id")), "function_name": str(
                b.get("name", "")), "arguments": _plain(args)}
            if raw is not None:
                call["extra"] = {"arguments_text": raw}
            calls.append(call)
        if calls:
            step["tool_calls"] = calls
        usage = usage_of(entry.event)
        metrics = _metrics(usage)
        if metrics is not None:
            step["metrics"] = metrics
            self.totals["prompt"] += int(metrics["prompt_tokens"])
            self.totals["completion"] += int(metrics["completion_tokens"])
            self.totals["cached"] += int(metrics["cached_tokens"])
        dsh: JsonObj = {"id": message.get("id"), "source": _plain(source)}
        if not _same(_agent_blocks(step), _plain(blocks)):
            dsh["content"] = _plain(blocks)
        step["extra"] = {"dsh": dsh}
        self.agent_step = step

    def result(self, entry: Entry, block: Mapping[str, Any]) -> None:
        message = entry.message
        call_id = str(block.get("toolCallId"))
        content = [b for b in block.get("content") or [] if isinstance(b, Mapping)]
        result: JsonObj = {"content": _text_message(content)}
        extra: JsonObj = {}
        if block.get("isError"):
            extra["is_error"] = True
        data = entry.event.get("data")
        if isinstance(data, Mapping) and isinstance(data.get("error"), Mapping):
            extra["error"] = _plain(data["error"])
        dsh: JsonObj = {"id": message.get("id"), "source": _plain(message.get("source"))}
        result["extra"] = {**extra, "dsh": dsh}
        if not _same(_result_block(call_id, result), _plain(block)):
            dsh["content"] = _plain(block)
        step = self.agent_step
        if step is not None and any(c["tool_call_id"] == call_id
                                    for c in step.get("tool_calls") or []):
            result["source_call_id"] = call_id
            step.setdefault("observation", {"results": []})["results"].append(result)
            return
        result["extra"]["call_id"] = call_id
        holder = self.step("system", entry, f"[tool result for call {call_id}]")
        holder["observation"] = {"results": [result]}
        holder["extra"] = {"dsh": {"observation_only": True}}

    def trajectory(self) -> JsonObj:
        for entry in history(self.log.events):
            self.entry(entry)
        from dsh._version import __version__

        header = _plain(self.log.header)
        agent: JsonObj = {"name": _AGENT_NAME, "version": __version__}
        if self.model:
            agent["model_name"] = self.model
        sid = str(header.get("id", ""))
        doc: JsonObj = {"schema_version": ATIF_VERSION, "session_id": sid,
                        "trajectory_id": sid, "agent": agent, "steps": self.steps,
                        "final_metrics": {
                            "total_prompt_tokens": self.totals["prompt"],
                            "total_completion_tokens": self.totals["completion"],
                            "total_cached_tokens": self.totals["cached"],
                            "total_steps": len(self.steps)},
                        "extra": {"dsh": {"header": header}}}
        children = [_Exporter(child).trajectory() for child in self.log.children]
        if children:
            doc["subagent_trajectories"] = children
        return doc


def _compaction_of(events: Sequence[Mapping[str, Any]], entry: Entry) -> JsonObj:
    """The ``compaction/summary`` data a checkpoint message cites (without the shadowed seqs)."""
    cited = set(entry.event.get("sourceEventSeqs") or [])
    for event in events:
        if event.get("seq") in cited and event.get("type") == "compaction/summary":
            data = event.get("data")
            if isinstance(data, Mapping):
                return {k: _plain(v) for k, v in data.items()
                        if k not in ("shadowedRange", "shadowedSeqs")}
    return {}


def to_atif(log: LogLike) -> JsonObj:
    """Export a session (and its subagent sessions) as one ATIF trajectory document.

    Args:
        log: The session: ``header``, ``events`` (wire events, seq order) and ``children``
            (an :class:`ImportedSession`, or a :class:`dsh.interop.SessionLog` of a stored one).

    Returns:
        The trajectory as plain JSON (``schema_version`` :data:`ATIF_VERSION`); the module
        docstring gives the mapping. :func:`validate_atif` checks it with the ``atif`` models.
    """
    return _Exporter(log).trajectory()


def validate_atif(doc: Mapping[str, Any]) -> Any:
    """Validate ``doc`` with the published ``atif`` models and return the ``Trajectory``.

    Raises:
        ConfigError: the ``atif`` package is not installed (code ``MISSING_EXTRA``; install
            ``dsh-session[atif]``).
        pydantic.ValidationError: the document breaks the ATIF schema.
    """
    try:
        from atif import Trajectory
    except ImportError as exc:
        raise ConfigError("validating ATIF needs the atif package: "
                          f"{install_hint('atif')}", code="MISSING_EXTRA") from exc
    return Trajectory.model_validate(dict(doc))


# --- import -----------------------------------------------------------------------------------


def import_atif(path: Path) -> list[ImportedSession]:
    """Import one ATIF trajectory file as a dsh session (subagents as its children).

    Raises:
        ImportFormatError: unreadable/empty/binary file, malformed JSON, or a document that is
            not an ATIF trajectory (no ``schema_version`` ``ATIF-…`` and ``steps`` list).
    """
    doc = read_json_document(path, FORMAT)
    if not looks_like_atif(doc):
        raise ImportFormatError("not an ATIF trajectory: expected an object with "
                                "schema_version 'ATIF-…' and a steps list; pass the --format "
                                "the file is in", path=str(path),
                                line=1, format=FORMAT)
    problem = _shape_problem(doc, "trajectory")
    if problem is not None:
        raise ImportFormatError(f"ATIF trajectory is malformed: {problem}", path=str(path),
                                line=1, format=FORMAT)
    return [_import(doc, path, None)]


_OPTIONAL: Final = type(None)


def _bad(value: object, *types: type) -> bool:
    return not isinstance(value, types) or (isinstance(value, bool) and bool not in types)


def _shape_problem(doc: Any, where: str) -> str | None:
    """What in ``doc`` breaks the shapes the importer reads (None when it reads it all).

    Checked: the fields the mapping uses (ATIF's own, and ``extra.dsh`` of a dsh export), so
    a damaged document is refused with a message naming the place instead of mapped halfway.
    """
    if not isinstance(doc, dict) or _bad(doc.get("steps"), list):
        return f"{where} must be an object with a steps list"
    for key in ("agent", "extra"):
        if _bad(doc.get(key), dict, _OPTIONAL):
            return f"{where}.{key} must be an object"
    header = _dsh(doc).get("header")
    if _bad(header, dict, _OPTIONAL) or (isinstance(header, dict) and any(
            _bad(header.get(k), str, _OPTIONAL) for k in ("id", "cwd", "parentSession"))):
        return f"{where}.extra.dsh.header must be an object of strings"
    for i, step in enumerate(doc["steps"]):
        at = f"{where}.steps[{i}]"
        if not isinstance(step, dict):
            return f"{at} must be an object"
        problem = _step_problem(step, at)
        if problem is not None:
            return problem
    subs = doc.get("subagent_trajectories")
    if _bad(subs, list, _OPTIONAL):
        return f"{where}.subagent_trajectories must be a list"
    for i, sub in enumerate(subs or []):
        problem = _shape_problem(sub, f"{where}.subagent_trajectories[{i}]")
        if problem is not None:
            return problem
    return None


def _message_problem(message: object, at: str) -> str | None:
    if isinstance(message, str) or message is None:
        return None
    if not isinstance(message, list) or not all(
            isinstance(p, dict) and not _bad(p.get("text"), str, _OPTIONAL) for p in message):
        return f"{at} must be a string or a list of content parts"
    return None


def _dsh_problem(obj: Mapping[str, Any], at: str) -> str | None:
    if _bad(obj.get("extra"), dict, _OPTIONAL):
        return f"{at}.extra must be an object"
    dsh = _dsh(obj)
    content = dsh.get("content")
    if (_bad(dsh.get("id"), str, _OPTIONAL) or _bad(dsh.get("source"), dict, _OPTIONAL)
            or _bad(content, list, dict, _OPTIONAL) or _bad(dsh.get("compaction"), dict,
                                                              _OPTIONAL)):
        return f"{at}.extra.dsh has a field of the wrong type"
    if isinstance(content, list) and not all(isinstance(b, dict) for b in content):
        return f"{at}.extra.dsh.content must be a list of blocks"
    shadows = dsh.get("shadows")
    if shadows is not None and not (isinstance(shadows, list) and len(shadows) == 2
                                    and all(isinstance(x, str) for x in shadows)):
        return f"{at}.extra.dsh.shadows must be two message ids"
    return None


def _step_problem(step: Mapping[str, Any], at: str) -> str | None:
    if step.get("source") not in ("system", "user", "agent"):
        return f"{at}.source must be system, user or agent"
    for key in ("timestamp", "reasoning_content", "model_name"):
        if _bad(step.get(key), str, _OPTIONAL):
            return f"{at}.{key} must be a string"
    problem = _message_problem(step.get("message"), f"{at}.message") or _dsh_problem(step, at)
    if problem is not None:
        return problem
    metrics = step.get("metrics")
    if _bad(metrics, dict, _OPTIONAL) or (isinstance(metrics, dict) and _bad(
            metrics.get("extra"), dict, _OPTIONAL)):
        return f"{at}.metrics must be an object"
    calls = step.get("tool_calls")
    if _bad(calls, list, _OPTIONAL):
        return f"{at}.tool_calls must be a list"
    for j, call in enumerate(calls or []):
        if not isinstance(call, dict) or _bad(call.get("tool_call_id"), str) or _bad(
                call.get("function_name"), str) or _bad(call.get("arguments"), dict,
                                                        _OPTIONAL) or _bad(
                call.get("extra"), dict, _OPTIONAL):
            return (f"{at}.tool_calls[{j}] must have a string tool_call_id and function_name "
                    "and object arguments")
    observation = step.get("observation")
    if observation is None:
        return None
    if not isinstance(observation, dict) or _bad(observation.get("results"), list):
        return f"{at}.observation must be an object with a results list"
    for j, result in enumerate(observation["results"]):
        rat = f"{at}.observation.results[{j}]"
        if not isinstance(result, dict) or _bad(result.get("source_call_id"), str, _OPTIONAL):
            return f"{rat} must be an object with a string or null source_call_id"
        problem = _message_problem(result.get("content"), f"{rat}.content") or _dsh_problem(
            result, rat)
        if problem is not None:
            return problem
        extra = result.get("extra")
        if isinstance(extra, dict) and (_bad(extra.get("call_id"), str, _OPTIONAL) or _bad(
                extra.get("error"), dict, _OPTIONAL)):
            return f"{rat}.extra has a field of the wrong type"
    return None


def _dsh(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    extra = obj.get("extra")
    dsh = extra.get("dsh") if isinstance(extra, Mapping) else None
    return dsh if isinstance(dsh, Mapping) else {}


def _import(doc: Mapping[str, Any], path: Path, parent: str | None) -> ImportedSession:
    note_line(1)
    header_in = _dsh(doc).get("header")
    header_in = header_in if isinstance(header_in, Mapping) else {}
    own = header_in.get("id") or doc.get("trajectory_id") or doc.get("session_id")
    if parent is None:
        session_id = stable_session_id(path, FORMAT, own)
    else:
        session_id = str_or_none(own) or derived_id(f"{FORMAT}:{parent}:{own}")
    b = EventBuilder(FORMAT, session_id, path)
    agent = doc.get("agent") if isinstance(doc.get("agent"), Mapping) else {}
    default_model = str_or_none(agent.get("model_name")) if isinstance(agent, Mapping) else None
    b.model = (FORMAT, default_model or "unknown")
    nodes_by_id: dict[str, int] = {}
    for step in doc.get("steps") or []:
        if not isinstance(step, Mapping):
            continue
        if isinstance(step.get("timestamp"), str):
            b.at(step["timestamp"])
        _import_step(b, step, nodes_by_id)
    b.finish()
    extra: JsonObj = {k: v for k, v in header_in.items()
                      if k in ("parentSession", "origin", "delegationDepth", "agentPreset")}
    if parent is not None:
        extra.update({"parentSession": parent, "origin": "subagent",
                      "delegationDepth": int(extra.get("delegationDepth") or 1)})
    session = b.imported(b.header(cwd=header_in.get("cwd"), extra=extra or None))
    for sub in doc.get("subagent_trajectories") or []:
        if isinstance(sub, Mapping):
            session.children.append(_import(sub, path, session_id))
    return session


def _note(nodes_by_id: dict[str, int], b: EventBuilder, seq: int,
          dsh: Mapping[str, Any] | None = None) -> None:
    """Remember a message's node by id, restoring the exact source/content an export kept."""
    message = b.events[seq]["data"]
    if b.events[seq]["type"] in ("assistant/message", "tool/result"):
        message = message["message"]
    if dsh:
        if isinstance(dsh.get("source"), Mapping):
            message["source"] = _plain(dsh["source"])
        content = dsh.get("content")
        if isinstance(content, list):
            message["content"] = _plain(content)
        elif isinstance(content, Mapping):  # a tool result's one block
            message["content"] = [_plain(content)]
    nodes_by_id[str(message["id"])] = seq


def _import_step(b: EventBuilder, step: Mapping[str, Any], nodes_by_id: dict[str, int]) -> None:
    dsh = _dsh(step)
    source = step.get("source")
    content = dsh.get("content")
    if source == "agent":
        blocks = _plain(content) if isinstance(content, list) else _agent_blocks(step)
        src = dsh.get("source") if isinstance(dsh.get("source"), Mapping) else {}
        model = str_or_none(step.get("model_name")) or (
            str_or_none(src.get("model")) if isinstance(src, Mapping) else None)
        metrics = step.get("metrics")
        usage = _usage_of_metrics(metrics) if isinstance(metrics, Mapping) else None
        seq = b.assistant(blocks, provider=str_or_none(src.get("provider")) if isinstance(
            src, Mapping) else None, model=model, message_id=dsh.get("id"), usage=usage,
            replay_state=_plain(src.get("replayState")) if isinstance(src, Mapping) else None)
        _note(nodes_by_id, b, seq, dsh)
        _observations(b, step, nodes_by_id)
        return
    blocks = _plain(content) if isinstance(content, list) else _blocks_of_message(
        step.get("message"))
    if dsh.get("observation_only"):
        _observations(b, step, nodes_by_id)
        return
    src = _plain(dsh.get("source")) if isinstance(dsh.get("source"), Mapping) else None
    shadows = dsh.get("shadows")
    if isinstance(shadows, list) and len(shadows) == 2 and all(
            str(s) in nodes_by_id for s in shadows):
        first, last = (b.nodes.index(nodes_by_id[str(s)]) for s in shadows)
        found = dsh.get("compaction")
        info: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        cid = str_or_none(info.get("compactionId")) or (str_or_none(src.get(
            "compactionId")) if isinstance(src, Mapping) else None) or (
            f"{b.session_id}:compaction:{b.compactions + 1}")
        if isinstance(src, dict) and "compactionId" in src:
            src["compactionId"] = cid  # the checkpoint names its own compaction
        seq = b.compaction(blocks, summary=_plain(info.get("summary")) if isinstance(
            info.get("summary"), list) else None, compaction_id=cid,
            provider=str_or_none(info.get("provider")), model=str_or_none(info.get("model")),
            token_count=token_count(info.get("shadowedTokenCount")),
            shadow=b.nodes[first:last + 1], message_id=dsh.get("id"), source=src)
        _note(nodes_by_id, b, seq)
        return
    if isinstance(src, Mapping) and src.get("plugin") == "compact":
        # a checkpoint whose replaced messages are not in this file: keep its text only
        src = {"kind": "plugin", "plugin": f"import/{FORMAT}", "form": "summary"}
    if source == "system":
        seq = b.system(blocks, message_id=dsh.get("id"), source=src)
    else:
        kind = src.get("kind") if isinstance(src, Mapping) else "user"
        seq = b.user(blocks, message_id=dsh.get("id"), source=src, prompt=kind == "user")
    _note(nodes_by_id, b, seq)  # the source and exact content went in above
    if step.get("observation") is not None:
        _observations(b, step, nodes_by_id)


def _observations(b: EventBuilder, step: Mapping[str, Any], nodes_by_id: dict[str, int]) -> None:
    observation = step.get("observation")
    results = observation.get("results") if isinstance(observation, Mapping) else None
    for result in results or []:
        if not isinstance(result, Mapping):
            continue
        dsh = _dsh(result)
        extra = result.get("extra") if isinstance(result.get("extra"), Mapping) else {}
        call_id = str_or_none(result.get("source_call_id")) or (
            str_or_none(extra.get("call_id")) if isinstance(extra, Mapping) else None)
        exact = dsh.get("content")
        if call_id is None:
            seq = b.user(_result_content(result.get("content")), prompt=False,
                         message_id=dsh.get("id"),
                         source={"kind": "plugin", "plugin": "import/atif", "form": "relay"})
            _note(nodes_by_id, b, seq)
            continue
        block = _plain(exact) if isinstance(exact, Mapping) else _result_block(call_id, result)
        error = extra.get("error") if isinstance(extra, Mapping) else None
        pending = b.has_pending(call_id)
        seq = b.tool_result(call_id, list(block.get("content") or []),
                            is_error=bool(block.get("isError")), message_id=dsh.get("id"),
                            error=_plain(error) if isinstance(error, Mapping) else None)
        _note(nodes_by_id, b, seq, dsh if pending else None)
