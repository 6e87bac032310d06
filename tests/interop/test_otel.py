"""OpenTelemetry: the agent's live spans (through the SDK's in-memory exporter) and the OTLP/JSON
replay of stored and imported logs share one GenAI mapping (docs/standards.md#opentelemetry)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from dsh.agent import (
    Agent,
    RetryPolicy,
    ScriptedCall,
    ScriptedFailure,
    ScriptedProvider,
    ScriptedReply,
    ScriptedStall,
    Telemetry,
)
from dsh.compaction import CompactionPolicy
from dsh.interop import span_records, to_otlp_json
from dsh.session import SessionStore
from tests.agent.helpers import add, assert_verifies, fail
from tests.interop.standards import imported, transcript_files


async def _no_sleep(seconds: float) -> None:
    return None


def _traced(provider: ScriptedProvider, exporter: InMemorySpanExporter, *,
            capture_content: bool = False, **options: Any) -> Agent:
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    return Agent.create(SessionStore(), provider, session_id="s-otel",
                        config={"provider": "scripted", "model": "m1"}, tools=[add, fail],
                        sleep=_no_sleep, retry=RetryPolicy(max_retries=2, base_delay_ms=1),
                        telemetry=Telemetry(tracing, capture_content=capture_content),
                        **options)


USAGE = {"inputTokens": 10, "outputTokens": 3, "cacheReadTokens": 40, "cacheWriteTokens": 2}


def _scripted_run(exporter: InMemorySpanExporter, **options: Any) -> Agent:
    """Turn 1: a retried request, two tool calls (one fails), an answer. Turns 2-5: long answers
    that put the small window under pressure (a compaction). Turn 6: cancelled mid-stream."""
    replies: list[Any] = [
        ScriptedFailure(code="RATE_LIMITED", retryable=True),
        ScriptedReply(text="calling", tool_calls=(
            ScriptedCall(name="add", arguments='{"a": 1, "b": 2}'),
            ScriptedCall(name="fail", arguments='{"reason": "boom"}')), usage=USAGE),
        ScriptedReply(text="three", usage=USAGE),
        *(ScriptedReply(text="answer " * 400) for _ in range(4)),
        ScriptedStall(after_text="Partial"),
    ]
    provider = ScriptedProvider(replies)
    agent = _traced(provider, exporter, context_window=2_000,
                    compaction=CompactionPolicy(threshold_ratio=0.5, retain_tokens=100),
                    **options)

    async def scenario() -> None:
        for prompt in ["add 1 and 2", "two", "three", "four", "five"]:
            await agent.run(prompt)
        task = asyncio.create_task(agent.run("six"))
        await provider.stalled.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert_verifies(agent.session)
    return agent


def _tree(spans: list[ReadableSpan]) -> list[tuple[str, str | None]]:
    by_id = {s.context.span_id: s for s in spans}
    return sorted((s.name, by_id[s.parent.span_id].name if s.parent else None) for s in spans)


def test_live_spans_of_a_scripted_run_with_tools_retries_compaction_and_cancel() -> None:
    exporter = InMemorySpanExporter()
    agent = _scripted_run(exporter)
    spans = list(exporter.get_finished_spans())
    names = Counter(s.name for s in spans)
    assert names["invoke_agent dsh"] == 6
    assert names["execute_tool add"] == names["execute_tool fail"] == 1
    assert names["update_memory dsh"] >= 1
    assert names["chat m1"] == 7  # one per model request; the retry is inside the first
    assert len({s.context.trace_id for s in spans}) == 6  # one trace per turn
    for span in spans:
        assert span.attributes["gen_ai.conversation.id"] == "s-otel"
        assert span.end_time >= span.start_time
    by_id = {s.context.span_id: s for s in spans}
    for span in spans:
        if span.name.startswith(("chat", "execute_tool")):
            assert by_id[span.parent.span_id].name == "invoke_agent dsh"
    for span in spans:  # compaction under pressure runs inside the turn that needed it
        if span.name == "update_memory dsh":
            assert by_id[span.parent.span_id].name == "invoke_agent dsh"
            assert span.attributes["gen_ai.operation.name"] == "update_memory"
            if span.status.status_code is StatusCode.ERROR:  # gave up: nothing replaced
                assert span.attributes["error.type"] == "CompactionError"
            else:
                assert span.attributes["dsh.compaction.shadowed_events"] > 0
    ended = [e for e in agent.session.events if e["type"] == "compaction/end"]
    assert len(ended) == names["update_memory dsh"]
    assert any("error" not in e["data"] for e in ended)

    first_chat = min((s for s in spans if s.name == "chat m1"), key=lambda s: s.start_time)
    assert first_chat.kind.name == "CLIENT"
    assert [e.name for e in first_chat.events] == ["dsh.llm.retry"]
    assert first_chat.events[0].attributes["error.type"] == "RATE_LIMITED"
    assert first_chat.attributes["gen_ai.provider.name"] == "scripted"
    assert first_chat.attributes["gen_ai.request.model"] == "m1"
    assert first_chat.attributes["gen_ai.usage.input_tokens"] == 52
    assert first_chat.attributes["gen_ai.usage.output_tokens"] == 3
    assert first_chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 40
    assert first_chat.attributes["gen_ai.usage.cache_creation.input_tokens"] == 2
    assert tuple(first_chat.attributes["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert "gen_ai.input.messages" not in first_chat.attributes  # content is opt-in

    calls = {e["data"]["name"]: e["data"]["callId"] for e in agent.session.events
             if e["type"] == "tool/call"}
    tools = {s.name: s for s in spans if s.name.startswith("execute_tool")}
    assert tools["execute_tool add"].attributes["gen_ai.tool.call.id"] == calls["add"]
    assert tools["execute_tool add"].status.status_code is StatusCode.UNSET
    assert tools["execute_tool fail"].attributes["gen_ai.tool.call.id"] == calls["fail"]
    assert tools["execute_tool fail"].status.status_code is StatusCode.ERROR
    assert tools["execute_tool fail"].attributes["error.type"] == "TOOL_ERROR"

    turns = sorted((s for s in spans if s.name == "invoke_agent dsh"),
                   key=lambda s: s.start_time)
    assert [t.attributes["dsh.turn.end_reason"] for t in turns] == ["completed"] * 5 + [
        "aborted"]
    last_chat = max((s for s in spans if s.name == "chat m1"), key=lambda s: s.start_time)
    assert tuple(last_chat.attributes["gen_ai.response.finish_reasons"]) == ("aborted",)


def test_live_spans_equal_the_replay_of_the_same_log() -> None:
    exporter = InMemorySpanExporter()
    agent = _scripted_run(exporter)
    live = list(exporter.get_finished_spans())
    replay = span_records(list(agent.session.events), "s-otel")

    def shape(name: str, parent: str | None, start: int, end: int,
              attributes: dict[str, Any]) -> tuple[Any, ...]:
        plain = {k: (list(v) if isinstance(v, tuple) else v) for k, v in attributes.items()}
        return name, parent, start, end, json.dumps(plain, sort_keys=True)

    got = sorted(shape(s.name, s.parent and next(p.name for p in live
                                                 if p.context.span_id == s.parent.span_id),
                       s.start_time, s.end_time, dict(s.attributes)) for s in live)
    want = sorted(shape(r.name, r.parent.name if r.parent else None, r.start_ms * 1_000_000,
                        (r.end_ms or r.start_ms) * 1_000_000,
                        {**r.attributes, **({"error.type": r.error} if r.error else {})})
                  for r in replay)
    assert got == want


def test_content_is_recorded_only_on_opt_in() -> None:
    exporter = InMemorySpanExporter()
    _scripted_run(exporter, capture_content=True)
    spans = list(exporter.get_finished_spans())
    chat = min((s for s in spans if s.name == "chat m1"), key=lambda s: s.start_time)
    assert json.loads(chat.attributes["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "add 1 and 2"}]}]
    output = json.loads(chat.attributes["gen_ai.output.messages"])
    assert output[0]["parts"][0] == {"type": "text", "content": "calling"}
    add_span = next(s for s in spans if s.name == "execute_tool add")
    assert add_span.attributes["gen_ai.tool.call.arguments"] == '{"a": 1, "b": 2}'
    assert json.loads(add_span.attributes["gen_ai.tool.call.result"]) == "3"


def test_an_agent_without_telemetry_configured_emits_nothing_and_imports_no_sdk() -> None:
    import subprocess
    import sys

    code = ("import sys, asyncio\n"
            "from dsh.agent import Agent, ScriptedProvider, ScriptedReply\n"
            "from dsh.session import SessionStore\n"
            "agent = Agent.create(SessionStore(), ScriptedProvider([ScriptedReply(text='hi')]), "
            "config={'provider': 'p', 'model': 'm'})\n"
            "asyncio.run(agent.run('go'))\n"
            "print(agent.stop_telemetry, 'opentelemetry' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out == ["None", "False"]


def _protobuf(doc: dict[str, Any]) -> ExportTraceServiceRequest:
    # OTLP/JSON writes trace and span ids as hex; protobuf's generic JSON mapping reads bytes as
    # base64, so the ids are re-encoded before the proto parser checks everything else.
    def ids(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: base64.b64encode(bytes.fromhex(v)).decode()
                    if k in ("traceId", "spanId", "parentSpanId") else ids(v)
                    for k, v in value.items()}
        return [ids(v) for v in value] if isinstance(value, list) else value

    return json_format.Parse(json.dumps(ids(doc)), ExportTraceServiceRequest())


@pytest.mark.parametrize("name", transcript_files())
def test_otlp_json_of_every_transcript_parses_with_one_execute_tool_per_call(name: str) -> None:
    for top in imported(name):
        doc = to_otlp_json(top, capture_content=True)
        request = _protobuf(doc)
        spans = [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
        calls = [e["data"]["callId"] for s in top.walk() for e in s.events
                 if e["type"] == "tool/call"]
        tool_ids = [next(a.value.string_value for a in s.attributes
                         if a.key == "gen_ai.tool.call.id")
                    for s in spans if s.name.startswith("execute_tool")]
        assert sorted(tool_ids) == sorted(calls)
        assert len({s.trace_id for s in spans}) == len(list(top.walk()))
        ids = {s.span_id for s in spans}
        assert all(s.parent_span_id in ids for s in spans if s.parent_span_id)
        assert all(s.end_time_unix_nano >= s.start_time_unix_nano for s in spans)
        assert doc == to_otlp_json(top, capture_content=True)  # stable ids


def test_cli_exports_an_imported_session_as_otlp_json(tmp_path: Any) -> None:
    from tests.interop.helpers import EXAMPLES
    from tests.interop.standards import cli

    dsh = cli(tmp_path / "s.db")

    dsh("import", str(EXAMPLES / "claude-code" / "long-debugging.jsonl"))
    [row] = json.loads(dsh("ls", "--json"))
    plain = json.loads(dsh("export", "--format", "otel", row["id"]))
    spans = [s for s in _protobuf(plain).resource_spans[0].scope_spans[0].spans]
    assert Counter(s.name.split()[0] for s in spans) == {"invoke_agent": 4, "chat": 10,
                                                        "execute_tool": 6}
    assert "gen_ai.input.messages" not in json.dumps(plain)
    rich = json.loads(dsh("export", "--format", "otel", "--content", row["id"]))
    assert "gen_ai.input.messages" in json.dumps(rich)
