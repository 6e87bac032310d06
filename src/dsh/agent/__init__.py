"""The agent loop of dsh: provider protocol, scripted provider, recorder, tools, loop, resume.

Everything the loop writes goes through one recording path (:mod:`dsh.agent.recorder`), so the
log it produces is well formed by construction (persistence spec §8.4).
"""

from __future__ import annotations

from dsh.agent.provider import (
    RETRYABLE_FAILURE_CODES,
    FinishKind,
    LlmRequest,
    LlmResponse,
    Provider,
    StreamAssembler,
    failure_error,
)
from dsh.agent.recorder import (
    ABORTED_BEFORE_DISPATCH,
    ABORTED_BEFORE_DISPATCH_TEXT,
    Recorder,
    StepRecorder,
    TurnRecorder,
    turn_end_reason,
)
from dsh.agent.scripted import (
    ScriptedCall,
    ScriptedFailure,
    ScriptedProvider,
    ScriptedReply,
    ScriptedStall,
    ScriptStep,
)
from dsh.errors import AgentError, LlmFailureError

__all__ = [
    "ABORTED_BEFORE_DISPATCH",
    "ABORTED_BEFORE_DISPATCH_TEXT",
    "RETRYABLE_FAILURE_CODES",
    "AgentError",
    "FinishKind",
    "LlmFailureError",
    "LlmRequest",
    "LlmResponse",
    "Provider",
    "Recorder",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedFailure",
    "ScriptedProvider",
    "ScriptedReply",
    "ScriptedStall",
    "StepRecorder",
    "StreamAssembler",
    "TurnRecorder",
    "failure_error",
    "turn_end_reason",
]
