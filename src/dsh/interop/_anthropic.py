"""Anthropic Messages conversations into dsh events.

Accepted documents (corpus README "Anthropic Messages"):

* a request body ``{"model", "messages", "system"?, "tools"?, …}`` (JSON);
* a bare list of Messages API messages (JSON);
* a VCR cassette (YAML or JSON) with ``interactions[].request.parsed_body`` and
  ``interactions[].response.parsed_body`` (YAML needs PyYAML);
* a JSONL of exchanges ``{cassette, interaction, request, response, status}`` — one session per
  ``cassette`` value.

For a recorded exchange sequence the conversation is the **last** request's messages plus its
response (earlier requests are prefixes of it); every exchange is also kept verbatim as an
ignorable ``import/anthropic/exchange`` event. Mapping: ``system`` → ``system/message``; user
``text`` → user message, ``tool_result`` → ``tool/result`` (``is_error`` kept); assistant
``text``, ``thinking`` (→ ``reasoning`` with its ``signature``), ``tool_use`` (→ ``tool-call``,
input as JSON text); any other block (``redacted_thinking``, ``compaction``, server tools,
images, documents) is kept as ``{"type": "provider-raw", "provider": "anthropic", "block"}``.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any, Final

from dsh._errors import ImportFormatError
from dsh.interop._common import (
    EventBuilder,
    ImportedSession,
    JsonObj,
    note_line,
    read_json_document,
    read_jsonl_records,
    read_source_bytes,
    stable_session_id,
    text_blocks,
    token_usage,
)
from dsh.json import MAX_SAFE_INTEGER, c_claude_blocks, c_claude_usage

FORMAT: Final = "anthropic"


ARGUMENTS_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
"""A ``tool_use`` input as arguments text: what ``json.dumps(input, ensure_ascii=False,
separators=(",", ":"))`` gives (the same encoder, made once instead of at each call)."""


def anthropic_blocks(content: Any) -> list[JsonObj]:
    """Messages API content (string or blocks) as dsh blocks, tool_result blocks excluded.

    The common list goes through the accelerator's ``claude_blocks`` (the loop below is its
    reference; docs/interop.md#streaming-imports).
    """
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if c_claude_blocks is not None:
        quick = c_claude_blocks(content, ARGUMENTS_ENCODER)
        if quick is not None:
            return quick
    out: list[JsonObj] = []
    for b in content if isinstance(content, list) else []:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            out.append({"type": "text", "text": b["text"]})
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            block: JsonObj = {"type": "reasoning", "text": b["thinking"]}
            if isinstance(b.get("signature"), str):
                block["signature"] = b["signature"]
            out.append(block)
        elif kind == "tool_use":
            out.append({"type": "tool-call", "id": str(b.get("id", "")),
                        "name": str(b.get("name", "")),
                        "arguments": ARGUMENTS_ENCODER(b.get("input", {}))})
        elif kind == "tool_result":
            continue
        else:
            out.append({"type": "provider-raw", "provider": "anthropic", "block": b})
    return out


def result_blocks(content: object) -> list[JsonObj]:
    """Anthropic ``tool_result.content`` (string or blocks) as dsh blocks (images kept raw)."""
    if isinstance(content, list):
        out: list[JsonObj] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(
                    part.get("text"), str):
                out.append({"type": "text", "text": part["text"]})
            else:
                out.append({"type": "provider-raw", "provider": "anthropic", "block": part})
        return out
    return text_blocks(content if content is not None else "")


def map_anthropic_conversation(b: EventBuilder, system: Any, messages: list[Any],
                               response: JsonObj | None, *, line: int | None = None) -> None:
    """Drive ``b`` with one Messages conversation (system, messages, optional response).

    Raises:
        ImportFormatError: a message that is not an object with role user/assistant.
    """
    if system:
        b.system(anthropic_blocks(system) if not isinstance(system, str)
                 else [{"type": "text", "text": system}])
    turns = list(messages)
    if response is not None and isinstance(response.get("content"), list):
        turns.append({"role": "assistant", "content": response["content"],
                      "_id": response.get("id"), "_usage": response.get("usage"),
                      "_model": response.get("model")})
    for index, m in enumerate(turns):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ImportFormatError(
                f"anthropic message {index} must be an object with role user or assistant; fix "
                "that message",
                path=str(b.path), line=line, format=FORMAT, json_path=f"$.messages[{index}]")
        content = m.get("content")
        if m["role"] == "assistant":
            usage = m.get("_usage")
            b.assistant(anthropic_blocks(content), model=m.get("_model") or None,
                        message_id=m.get("_id"), usage=anthropic_usage(usage))
            continue
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    b.tool_result(str(block.get("tool_use_id", "")),
                                  result_blocks(block.get("content")),
                                  is_error=bool(block.get("is_error")))
            rest = [x for x in content if not (isinstance(x, dict) and
                                               x.get("type") == "tool_result")]
            if rest:
                b.user(anthropic_blocks(rest))
        else:
            b.user(anthropic_blocks(content))


def anthropic_usage(raw: object) -> JsonObj | None:
    """Messages API ``usage`` as a dsh ``TokenUsage`` (cache reads/writes kept), or None.

    Counts that are not usable numbers (text, negative, fractional) count 0; the raw usage
    stays in the kept source record. A dict of plain counts goes through the accelerator's
    ``claude_usage`` (:func:`token_usage` is its reference).
    """
    if c_claude_usage is not None:
        quick = c_claude_usage(raw)
        if quick is not None:
            return quick
    return token_usage(raw, {"inputTokens": "input_tokens", "outputTokens": "output_tokens",
                             "cacheReadTokens": "cache_read_input_tokens",
                             "cacheWriteTokens": "cache_creation_input_tokens"})


def _load_yaml(path: Path) -> Any:
    raw = read_source_bytes(path, FORMAT)
    try:
        yaml = importlib.import_module("yaml")
    except ImportError as exc:
        raise ImportFormatError(
            "anthropic YAML cassettes need PyYAML; install it (pip install pyyaml) or convert "
            "the cassette to JSON", path=str(path), format=FORMAT) from exc
    loader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
    try:
        doc = yaml.load(raw.decode("utf-8"), Loader=loader)
    except RecursionError as exc:
        raise ImportFormatError(
            "anthropic cassette nests too deep to be a cassette", path=str(path),
            format=FORMAT) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at column {mark.column + 1}" if mark is not None else ""
        raise ImportFormatError(
            f"anthropic cassette is not valid YAML{at} ({getattr(exc, 'problem', exc)}); fix "
            "the file, or re-record the cassette",
            path=str(path), line=(mark.line + 1) if mark is not None else None,
            format=FORMAT) from exc
    return doc


def _exchanges_from_cassette(doc: Any, path: Path) -> list[JsonObj]:
    interactions = doc.get("interactions") if isinstance(doc, dict) else None
    if not isinstance(interactions, list):
        raise ImportFormatError("anthropic cassette lacks an interactions list", path=str(path),
                                format=FORMAT)
    out: list[JsonObj] = []
    for index, it in enumerate(interactions):
        req = (it.get("request") or {}).get("parsed_body") if isinstance(it, dict) else None
        resp = (it.get("response") or {}).get("parsed_body") if isinstance(it, dict) else None
        out.append({"interaction": index, "request": req, "response": resp})
    return out


def _session(path: Path, session_id: str, exchanges: list[JsonObj],
             line: int | None = None) -> ImportedSession:
    if line is not None:
        note_line(line)
    b = EventBuilder(FORMAT, session_id, path)
    b.model = ("anthropic", "unknown")
    for ex in exchanges:
        b.ignorable("exchange", _plain(ex))
    final = exchanges[-1] if exchanges else None
    request = final.get("request") if final else None
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        raise ImportFormatError("anthropic exchange lacks a request body with messages; check "
                                "the exchange's request",
                                path=str(path), line=line, format=FORMAT)
    if isinstance(request.get("model"), str):
        b.model = ("anthropic", request["model"])
    response = final.get("response") if final else None
    map_anthropic_conversation(b, request.get("system"), request["messages"],
                               response if isinstance(response, dict) else None, line=line)
    b.finish()
    return b.imported(b.header())


def _plain(value: Any) -> Any:
    """YAML may yield non-JSON scalars (dates); render them as text so the event is JSON."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return int(value) if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER else value
    return str(value)


def import_anthropic(path: Path) -> list[ImportedSession]:
    """Import an Anthropic request body, message list, cassette or exchanges JSONL.

    Returns:
        One session per conversation (one per cassette in an exchanges JSONL).

    Raises:
        ImportFormatError: unreadable/empty/binary/malformed file or an unrecognised shape.
    """
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        doc = _load_yaml(path)
        return [_session(path, stable_session_id(path, FORMAT),
                         _exchanges_from_cassette(doc, path))]
    if suffix == ".jsonl":
        groups: dict[str, list[JsonObj]] = {}
        first_line: dict[str, int] = {}
        for line, rec in read_jsonl_records(path, FORMAT):
            note_line(line)
            if not isinstance(rec, dict) or "request" not in rec:
                raise ImportFormatError(
                    "anthropic exchange must be an object with a request; fix or delete that "
                    "line",
                    path=str(path), line=line, format=FORMAT)
            key = str(rec.get("cassette", ""))
            groups.setdefault(key, []).append(rec)
            first_line.setdefault(key, line)
        return [_session(path, stable_session_id(path, f"{FORMAT}:{key}"), recs,
                         line=first_line[key]) for key, recs in groups.items()]
    doc = read_json_document(path, FORMAT)
    session_id = stable_session_id(path, FORMAT)
    if isinstance(doc, dict) and "interactions" in doc:
        return [_session(path, session_id, _exchanges_from_cassette(doc, path))]
    if isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        return [_session(path, session_id, [{"request": doc, "response": None}])]
    if isinstance(doc, list):
        return [_session(path, session_id, [{"request": {"messages": doc}, "response": None}])]
    raise ImportFormatError(
        "anthropic document must be a request body, a message list or a cassette, found "
        f"{type(doc).__name__}; pass the --format the file is in", path=str(path), line=1,
        format=FORMAT)
