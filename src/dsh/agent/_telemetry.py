"""Live OpenTelemetry spans of an agent: the replay mapping, fed as events are committed.

:class:`Telemetry` observes the session (``Session.observe``) and feeds each committed event to
the same :class:`dsh.interop.SpanMapper` that ``dsh export --format otel`` replays, creating real
spans through the OpenTelemetry API with the events' own times. So a live run and the export of
its stored log give the same span names, parents and attributes. Rule:
docs/standards.md#opentelemetry.

The ``opentelemetry`` package (extra ``otel``) is imported only here, when a Telemetry is made;
``import dsh`` and ``import dsh.agent`` never import it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dsh._errors import ConfigError
from dsh._install import install_hint

if TYPE_CHECKING:
    from dsh.interop import SpanRecord
    from dsh.session import Event, Session


INSTRUMENTATION: str = "dsh.agent"


class Telemetry:
    """Where an :class:`~dsh.agent.Agent` sends its spans.

    Args:
        tracer_provider: An OpenTelemetry ``TracerProvider`` (None: the global one, as set by
            ``opentelemetry.trace.set_tracer_provider``).
        capture_content: Record prompts, answers, tool arguments and results on the spans
            (``gen_ai.input.messages`` …). Off by default: content may be sensitive.

    Raises:
        ConfigError: code ``MISSING_EXTRA`` when ``opentelemetry-api`` is not installed
            (``pip install 'dsh-session[otel]'``).
    """

    def __init__(self, tracer_provider: Any = None, *, capture_content: bool = False) -> None:
        try:
            from opentelemetry import trace
        except ImportError as exc:
            raise ConfigError("agent telemetry needs the OpenTelemetry API: "
                              f"{install_hint('otel')}", code="MISSING_EXTRA") from exc
        from dsh._version import __version__

        self._trace = trace
        provider = tracer_provider or trace.get_tracer_provider()
        self._tracer = provider.get_tracer(INSTRUMENTATION, __version__)
        self.capture_content = capture_content

    def attach(self, session: Session) -> Callable[[], None]:
        """Emit the spans of every event committed to ``session`` from now on.

        Returns:
            A function that stops it (open spans are ended, marked ``dsh.incomplete``).
        """
        live = _Live(self, session.id)
        stop_observing = session.observe(live.observe)

        def detach() -> None:
            stop_observing()
            live.close()

        return detach

    def _start(self, span: SpanRecord, parent: Any) -> Any:
        from opentelemetry.trace import SpanKind

        context = self._trace.set_span_in_context(parent) if parent is not None else None
        kind = SpanKind.CLIENT if span.kind == "client" else SpanKind.INTERNAL
        return self._tracer.start_span(span.name, context=context, kind=kind,
                                       start_time=span.start_ms * 1_000_000,
                                       attributes=dict(span.attributes))

    def _end(self, span: SpanRecord, live: Any) -> None:
        from opentelemetry.trace import Status, StatusCode

        live.update_name(span.name)
        live.set_attributes(dict(span.attributes))
        for name, time_ms, attributes in span.events:
            live.add_event(name, attributes=dict(attributes), timestamp=time_ms * 1_000_000)
        if span.error is not None:
            live.set_attribute("error.type", span.error)
            live.set_status(Status(StatusCode.ERROR, span.error))
        live.end(end_time=(span.end_ms if span.end_ms is not None else span.start_ms)
                 * 1_000_000)


class _Live:
    """One session's mapper and the OpenTelemetry spans it has open."""

    def __init__(self, telemetry: Telemetry, session_id: str) -> None:
        from dsh.interop import SpanMapper  # loaded with the first traced session only

        self.telemetry = telemetry
        self.mapper = SpanMapper(session_id, capture_content=telemetry.capture_content)
        self.spans: dict[int, Any] = {}
        self.last_ms = 0

    def observe(self, session: Session, event: Event) -> None:
        self.last_ms = int(event.get("time") or 0)
        self.apply(self.mapper.feed(event))

    def apply(self, actions: Sequence[tuple[str, SpanRecord]]) -> None:
        for action, span in actions:
            if action == "start":
                parent = self.spans.get(id(span.parent)) if span.parent is not None else None
                self.spans[id(span)] = self.telemetry._start(span, parent)
            else:
                live = self.spans.pop(id(span), None)
                if live is not None:
                    self.telemetry._end(span, live)

    def close(self) -> None:
        self.apply(list(self.mapper.finish(self.last_ms)))


def default_telemetry(telemetry: Telemetry | bool | None) -> Telemetry | None:
    """The telemetry an Agent uses: the one given; False for none; None for the default.

    The default emits through the global tracer provider when the application has set
    OpenTelemetry up (the ``opentelemetry.trace`` module is loaded and a real provider is
    set), and emits nothing otherwise, without importing OpenTelemetry.
    """
    if isinstance(telemetry, Telemetry):
        return telemetry
    if telemetry is False:
        return None
    if telemetry is True:
        return Telemetry()
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return None
    return Telemetry(provider)
