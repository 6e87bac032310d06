"""Exporters of the model view (derived messages) to provider request formats, and a checker.

Input is what ``Session.derive_messages()`` returns (docs/rules.md#deriving-messages): message
mappings with
``id``, ``role`` (``system`` | ``user`` | ``assistant``), ``content`` blocks
(docs/events.md#content-blocks: ``text``, ``reasoning``, ``image``, ``tool-call``, ``tool-result``;
importers add ``provider-raw``) and ``source``.

Conversions shared by both exporters (chosen so the output is always a valid request):

* A tool result whose call is not outstanding (an *orphan*: its call was compacted away or lies
  outside an excerpt) is **converted** to plain user text ``[tool result for call <id>] …`` —
  never emitted as a provider tool result, so no output starts with or contains an orphan.
* A tool call that is still unanswered when the next non-result message (or the end) arrives is
  answered with a synthetic error result saying no result was recorded (interrupted sessions).
* Lone surrogates in any string become U+FFFD in the provider output only (the log keeps them).
* ``image`` blocks become a short text placeholder naming the attachment (the log holds only an
  attachment reference, not the bytes).
* With ``target_model`` (the model the request is for), reasoning produced by any other model
  is left out (:func:`without_foreign_reasoning`): a thinking signature or encrypted reasoning
  is valid only for the model that made it (Anthropic answers a foreign one with a 400).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dsh._errors import ConfigError

MISSING_RESULT_TEXT: Final = "No result was recorded for this tool call (the session was cut off)."
"""Text of the synthetic result answering an unanswered call in an export."""

_LONE = re.compile("[\ud800-\udfff]")


def _clean(value: Any) -> Any:
    """Deep copy into plain containers with lone surrogates replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE.sub("\ufffd", value) if _LONE.search(value) else value
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _text_of(blocks: Sequence[Any]) -> str:
    parts: list[str] = []
    for b in blocks:
        if not isinstance(b, Mapping):
            continue
        kind = b.get("type")
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append(b["text"])
        elif kind == "image":
            att = b.get("attachment")
            name = (att.get("name") or att.get("attachmentId")) if isinstance(att, Mapping) \
                else None
            parts.append(f"[image {name}]" if name else "[image]")
        elif kind == "tool-result":
            parts.append(_text_of(b.get("content") or []))
        elif kind == "provider-raw":
            raw = b.get("block")
            if isinstance(raw, Mapping) and isinstance(raw.get("text"), str):
                parts.append(raw["text"])
    return "\n".join(p for p in parts if p)


def _orphan_text(block: Mapping[str, Any]) -> str:
    body = _text_of(block.get("content") or [])
    return f"[tool result for call {block.get('toolCallId')}]" + (f"\n{body}" if body else "")


def _is_reasoning(block: object) -> bool:
    """A reasoning block, or Anthropic's redacted thinking kept raw by the importers."""
    if not isinstance(block, Mapping):
        return False
    raw = block.get("block")
    return block.get("type") == "reasoning" or (
        block.get("type") == "provider-raw" and isinstance(raw, Mapping)
        and raw.get("type") == "redacted_thinking")


def without_foreign_reasoning(messages: Sequence[Mapping[str, Any]],
                              target_model: str) -> list[Mapping[str, Any]]:
    """Return ``messages`` without the reasoning of assistant messages from other models.

    Rule: reasoning belongs to the model that produced it. An assistant message whose
    ``source.model`` is not ``target_model`` loses its ``reasoning`` blocks (signed thinking,
    encrypted reasoning, plain reasoning text) and raw ``redacted_thinking`` blocks; its text
    and tool calls stay. Other messages, and messages with nothing to drop, are passed through
    as the same objects.

    Args:
        messages: Derived messages (module docstring).
        target_model: The model id the request will be sent to, e.g. ``"claude-sonnet-4-5"``.

    Returns:
        A new list of the same length and order.
    """
    out: list[Mapping[str, Any]] = []
    for m in messages:
        source = m.get("source")
        own = isinstance(source, Mapping) and source.get("model") == target_model
        content = m.get("content") or []
        if m.get("role") == "assistant" and not own and any(_is_reasoning(b) for b in content):
            m = {**m, "content": [b for b in content if not _is_reasoning(b)]}
        out.append(m)
    return out


# --- OpenAI Chat Completions ------------------------------------------------------------------


def to_openai(messages: Sequence[Mapping[str, Any]], *, include_reasoning: bool = False,
              target_model: str | None = None) -> list[dict[str, Any]]:
    """Convert derived messages to an OpenAI Chat Completions ``messages`` list.

    Args:
        messages: Derived messages (see module docstring).
        include_reasoning: Put ``reasoning`` text in ``reasoning_content`` (DeepSeek-style);
            by default reasoning is dropped because Chat Completions has no field for it.
        target_model: The model the request is for: reasoning of other models is left out
            (:func:`without_foreign_reasoning`); None keeps all.

    Returns:
        ``[{"role": "system"|"user"|"assistant"|"tool", ...}]``: assistant tool calls as
        ``tool_calls`` ``[{id, type: "function", function: {name, arguments}}]``, each result a
        ``{"role": "tool", "tool_call_id", "content"}`` message. Orphan results are converted to
        user text and unanswered calls get a synthetic result (module docstring);
        ``provider-raw`` blocks are dropped.
    """
    if target_model is not None:
        messages = without_foreign_reasoning(messages, target_model)
    out: list[dict[str, Any]] = []
    outstanding: list[str] = []

    def settle() -> None:
        for call_id in outstanding:
            out.append({"role": "tool", "tool_call_id": call_id, "content": MISSING_RESULT_TEXT})
        outstanding.clear()

    for m in messages:
        role = m.get("role")
        content = list(m.get("content") or [])
        if role == "assistant":
            settle()
            text = "".join(b["text"] for b in content if isinstance(b, Mapping)
                           and b.get("type") == "text" and isinstance(b.get("text"), str))
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            reasoning = "".join(b.get("text", "") for b in content if isinstance(b, Mapping)
                                and b.get("type") == "reasoning")
            if include_reasoning and reasoning:
                msg["reasoning_content"] = reasoning
            calls = [b for b in content if isinstance(b, Mapping) and b.get("type") == "tool-call"]
            if calls:
                msg["tool_calls"] = [{"id": str(c.get("id")), "type": "function",
                                      "function": {"name": str(c.get("name", "")),
                                                   "arguments": str(c.get("arguments", ""))}}
                                     for c in calls]
                outstanding.extend(str(c.get("id")) for c in calls)
            elif msg["content"] is None:
                msg["content"] = ""
            out.append(msg)
            continue
        if role == "system":
            settle()
            out.append({"role": "system", "content": _text_of(content)})
            continue
        rest: list[Any] = []
        for b in content:
            if isinstance(b, Mapping) and b.get("type") == "tool-result":
                call_id = str(b.get("toolCallId"))
                if call_id in outstanding:
                    outstanding.remove(call_id)
                    out.append({"role": "tool", "tool_call_id": call_id,
                                "content": _text_of(b.get("content") or [])})
                else:
                    rest.append({"type": "text", "text": _orphan_text(b)})
            else:
                rest.append(b)
        if rest:
            settle()
            out.append({"role": "user", "content": _text_of(rest)})
    settle()
    return [_clean(m) for m in out]


# --- Anthropic Messages -----------------------------------------------------------------------


def _tool_input(arguments: Any) -> Any:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def to_anthropic(messages: Sequence[Mapping[str, Any]], *,
                 target_model: str | None = None) -> dict[str, Any]:
    """Convert derived messages to an Anthropic Messages request fragment.

    Args:
        messages: Derived messages (see module docstring).
        target_model: The model the request is for: signed thinking and redacted thinking of
            other models are left out (:func:`without_foreign_reasoning`; replaying them is a
            400); None keeps all.

    Returns:
        ``{"system": str, "messages": [...]}`` (``system`` only when a system message exists;
        all system messages are joined with blank lines). Consecutive same-role content is
        merged so roles alternate, ``tool_result`` blocks lead their user message, orphan
        results become text and unanswered calls get a synthetic ``is_error`` result (module
        docstring). ``reasoning`` becomes a ``thinking`` block only when it carries a
        ``signature`` (Anthropic rejects unsigned thinking); unsigned reasoning is dropped.
        ``provider-raw`` blocks from Anthropic are emitted verbatim (both roles), others
        dropped; empty or
        whitespace-only text blocks are dropped (Anthropic rejects them) and a result without
        text has no ``content``. If the conversation would start with an assistant turn, a
        user message ``[earlier conversation not included]`` is put first.
    """
    if target_model is not None:
        messages = without_foreign_reasoning(messages, target_model)
    system: list[str] = []
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    outstanding: list[str] = []

    def push(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, list(blocks)))

    def settle() -> None:
        push("user", [{"type": "tool_result", "tool_use_id": c, "is_error": True,
                       "content": [{"type": "text", "text": MISSING_RESULT_TEXT}]}
                      for c in outstanding])
        outstanding.clear()

    for m in messages:
        role = m.get("role")
        content = list(m.get("content") or [])
        if role == "system":
            text = _text_of(content)
            if text:
                system.append(text)
            continue
        if role == "assistant":
            settle()
            blocks: list[dict[str, Any]] = []
            for b in content:
                if not isinstance(b, Mapping):
                    continue
                kind = b.get("type")
                if kind == "text" and isinstance(b.get("text"), str) and b["text"].strip():
                    blocks.append({"type": "text", "text": b["text"]})
                elif kind == "reasoning" and isinstance(b.get("signature"), str):
                    blocks.append({"type": "thinking", "thinking": b.get("text", ""),
                                   "signature": b["signature"]})
                elif kind == "tool-call":
                    blocks.append({"type": "tool_use", "id": str(b.get("id")),
                                   "name": str(b.get("name", "")),
                                   "input": _tool_input(b.get("arguments"))})
                    outstanding.append(str(b.get("id")))
                elif kind == "provider-raw" and b.get("provider") == "anthropic" and isinstance(
                        b.get("block"), Mapping):
                    blocks.append(dict(b["block"]))
            push("assistant", blocks)
            continue
        results: list[dict[str, Any]] = []
        rest: list[dict[str, Any]] = []
        for b in content:
            if isinstance(b, Mapping) and b.get("type") == "tool-result":
                call_id = str(b.get("toolCallId"))
                if call_id in outstanding:
                    outstanding.remove(call_id)
                    text = _text_of(b.get("content") or [])
                    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
                    if text.strip():
                        block["content"] = [{"type": "text", "text": text}]
                    if b.get("isError"):
                        block["is_error"] = True
                    results.append(block)
                else:
                    rest.append({"type": "text", "text": _orphan_text(b)})
            elif (isinstance(b, Mapping) and b.get("type") == "provider-raw"
                  and b.get("provider") == "anthropic" and isinstance(b.get("block"), Mapping)):
                rest.append(dict(b["block"]))  # images, documents: replayed verbatim
            elif isinstance(b, Mapping):
                text = _text_of([b])
                if text.strip():
                    rest.append({"type": "text", "text": text})
        if results:
            push("user", results)
        if rest:
            settle()
            push("user", rest)
    settle()
    ordered: list[dict[str, Any]] = []
    for role, blocks in turns:
        if role == "user":
            # Results must lead the user message that answers the previous assistant turn.
            blocks = ([b for b in blocks if b.get("type") == "tool_result"]
                      + [b for b in blocks if b.get("type") != "tool_result"])
        ordered.append({"role": role, "content": blocks})
    if ordered and ordered[0]["role"] != "user":
        ordered.insert(0, {"role": "user", "content": [
            {"type": "text", "text": "[earlier conversation not included]"}]})
    body: dict[str, Any] = {"messages": ordered}
    if system:
        body = {"system": "\n\n".join(system), "messages": ordered}
    return _clean(body)  # type: ignore[no-any-return]


# --- checking ---------------------------------------------------------------------------------


def _surrogates(value: Any, where: str, problems: list[str]) -> None:
    if isinstance(value, str):
        if _LONE.search(value):
            problems.append(f"{where}: string holds a lone surrogate (invalid UTF-8 on the wire)")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _surrogates(v, f"{where}.{k}", problems)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _surrogates(v, f"{where}[{i}]", problems)


def validate_conversation(provider_messages: Any, provider: str) -> list[str]:
    """Check a provider conversation; return one sentence per problem (empty list = valid).

    Args:
        provider_messages: For ``"openai"`` a Chat Completions message list; for
            ``"anthropic"`` a message list or the ``{"system", "messages"}`` dict of
            :func:`to_anthropic`.
        provider: ``"openai"`` or ``"anthropic"``.

    Checks (provider rules for tool use): every tool call is answered exactly once and before
    the next non-result message; no result answers a call that is not outstanding (orphan);
    no string holds a lone surrogate; for Anthropic also: the first message is ``user``, roles
    alternate, results sit in the user message right after their ``tool_use`` and lead it, no
    message is empty and no text block is empty or whitespace only.

    Raises:
        ConfigError: ``provider`` is neither ``"openai"`` nor ``"anthropic"``.
    """
    problems: list[str] = []
    if provider == "openai":
        _check_openai(provider_messages, problems)
    elif provider == "anthropic":
        msgs = provider_messages.get("messages") if isinstance(provider_messages, Mapping) \
            else provider_messages
        _check_anthropic(msgs, problems)
    else:
        raise ConfigError(f"provider must be 'openai' or 'anthropic', found {provider!r}")
    _surrogates(provider_messages, "$", problems)
    return problems


def _check_openai(messages: Any, problems: list[str]) -> None:
    if not isinstance(messages, list):
        problems.append("openai conversation must be a list of messages")
        return
    outstanding: list[str] = []
    answered: set[str] = set()
    seen_non_system = False
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, Mapping) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            problems.append(f"message {i}: unknown role {role!r}")
            continue
        assert isinstance(m, Mapping)
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not seen_non_system:
                problems.append(f"message {i}: conversation starts with a tool result")
            if call_id in outstanding:
                outstanding.remove(call_id)
                answered.add(str(call_id))
            elif call_id in answered:
                problems.append(f"message {i}: tool call {call_id} answered more than once")
            else:
                problems.append(f"message {i}: orphan tool result for unknown call {call_id}")
            seen_non_system = True
            continue
        if outstanding:
            problems.append(f"message {i}: tool calls {', '.join(outstanding)} are not answered "
                            "before the next message")
            outstanding.clear()
        if role != "system":
            seen_non_system = True
        if role == "assistant":
            for call in m.get("tool_calls") or []:
                call_id = str(call.get("id")) if isinstance(call, Mapping) else None
                if not call_id:
                    problems.append(f"message {i}: tool call without id")
                    continue
                answered.discard(call_id)  # a reused id starts a new exchange
                outstanding.append(call_id)
    if outstanding:
        problems.append(f"end: tool calls {', '.join(outstanding)} are never answered")


def _check_anthropic(messages: Any, problems: list[str]) -> None:
    if not isinstance(messages, list):
        problems.append("anthropic conversation must be a list of messages")
        return
    if messages and (not isinstance(messages[0], Mapping) or messages[0].get("role") != "user"):
        problems.append("message 0: the first message must have role user")
    outstanding: list[str] = []
    previous = None
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, Mapping) else None
        if role not in ("user", "assistant"):
            problems.append(f"message {i}: role must be user or assistant, found {role!r}")
            continue
        assert isinstance(m, Mapping)
        if role == previous:
            problems.append(f"message {i}: role {role} repeats; roles must alternate")
        previous = role
        content = m.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if not blocks:
            problems.append(f"message {i}: content is empty")
        if role == "assistant":
            problems.extend(f"message {i}: text block is empty or whitespace only"
                            for b in blocks if isinstance(b, Mapping) and b.get("type") == "text"
                            and not str(b.get("text") or "").strip())
            if outstanding:
                problems.append(f"message {i}: tool_use {', '.join(outstanding)} not answered "
                                "in the next user message")
            outstanding = [str(b.get("id")) for b in blocks
                           if isinstance(b, Mapping) and b.get("type") == "tool_use"]
            continue
        seen_other = False
        for b in blocks:
            if isinstance(b, Mapping) and b.get("type") == "text" and not str(
                    b.get("text") or "").strip():
                problems.append(f"message {i}: text block is empty or whitespace only")
            if isinstance(b, Mapping) and b.get("type") == "tool_result":
                call_id = str(b.get("tool_use_id"))
                if seen_other:
                    problems.append(f"message {i}: tool_result {call_id} after other content")
                if call_id in outstanding:
                    outstanding.remove(call_id)
                else:
                    problems.append(f"message {i}: tool_result {call_id} answers no outstanding "
                                    "tool_use (orphan or duplicate)")
            else:
                seen_other = True
        if outstanding:
            problems.append(f"message {i}: tool_use {', '.join(outstanding)} not answered")
            outstanding = []
    if outstanding:
        problems.append(f"end: tool_use {', '.join(outstanding)} never answered")
