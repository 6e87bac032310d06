"""The agent loop of dsh: provider protocol, scripted provider, recorder, tools, loop, resume.

Everything the loop writes goes through one recording path (:mod:`dsh.agent._recorder`), so the
log it produces is well formed by construction (docs/agent.md#the-recorder). Tools declare their
effect class; a resumed agent decides per class what a crash-interrupted call owes, and
approvals are durable events answered with :func:`approve` / :func:`deny` from any process
(Rule: docs/effects.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh._errors import AgentError, LlmFailureError
from dsh._lazy import lazy_exports

if TYPE_CHECKING:
    from dsh.agent._approvals import approve, deny, pending_approvals
    from dsh.agent._builtin import (
        ShellApproval,
        ShellRequest,
        refuse_all,
        shell_tool,
        workspace_tools,
    )
    from dsh.agent._effects import PendingApproval, idempotency_key
    from dsh.agent._inbox import Inbox, InboxTarget
    from dsh.agent._loop import (
        DEFAULT_APPROVAL_TIMEOUT_MS,
        Agent,
        InvariantStats,
        RetryPolicy,
        TurnResult,
    )
    from dsh.agent._provider import (
        RETRYABLE_FAILURE_CODES,
        FinishKind,
        LlmRequest,
        LlmResponse,
        Provider,
        StreamAssembler,
        failure_error,
    )
    from dsh.agent._recorder import (
        ABORTED_BEFORE_DISPATCH,
        ABORTED_BEFORE_DISPATCH_TEXT,
        Recorder,
        StepRecorder,
        TurnRecorder,
        turn_end_reason,
    )
    from dsh.agent._scripted import (
        ScriptedCall,
        ScriptedFailure,
        ScriptedProvider,
        ScriptedReply,
        ScriptedStall,
        ScriptStep,
    )
    from dsh.agent._telemetry import Telemetry
    from dsh.agent._tools import (
        DEFAULT_TOOL_TIMEOUT_MS,
        TOOL_EFFECTS,
        Tool,
        ToolContext,
        ToolEffect,
        ToolOutput,
        tool,
    )

__all__ = [
    "ABORTED_BEFORE_DISPATCH",
    "ABORTED_BEFORE_DISPATCH_TEXT",
    "DEFAULT_APPROVAL_TIMEOUT_MS",
    "DEFAULT_TOOL_TIMEOUT_MS",
    "RETRYABLE_FAILURE_CODES",
    "TOOL_EFFECTS",
    "Agent",
    "AgentError",
    "FinishKind",
    "Inbox",
    "InboxTarget",
    "InvariantStats",
    "LlmFailureError",
    "LlmRequest",
    "LlmResponse",
    "PendingApproval",
    "Provider",
    "Recorder",
    "RetryPolicy",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedFailure",
    "ScriptedProvider",
    "ScriptedReply",
    "ScriptedStall",
    "ShellApproval",
    "ShellRequest",
    "StepRecorder",
    "StreamAssembler",
    "Tool",
    "ToolContext",
    "ToolEffect",
    "ToolOutput",
    "Telemetry",
    "TurnRecorder",
    "TurnResult",
    "approve",
    "deny",
    "failure_error",
    "idempotency_key",
    "pending_approvals",
    "refuse_all",
    "shell_tool",
    "tool",
    "turn_end_reason",
    "workspace_tools",
]

# PEP 562: each name loads its module on first use, so importing a light submodule (the CLI's
# `dsh.agent.providers._config`) does not load the loop, its tools and asyncio.
_LAZY: dict[str, str] = {name: module for module, names in {
    "dsh.agent._approvals": ("approve", "deny", "pending_approvals"),
    "dsh.agent._effects": ("PendingApproval", "idempotency_key"),
    "dsh.agent._builtin": ("ShellApproval", "ShellRequest", "refuse_all", "shell_tool",
                          "workspace_tools"),
    "dsh.agent._inbox": ("Inbox", "InboxTarget"),
    "dsh.agent._loop": ("DEFAULT_APPROVAL_TIMEOUT_MS", "Agent", "InvariantStats", "RetryPolicy",
                        "TurnResult"),
    "dsh.agent._provider": ("RETRYABLE_FAILURE_CODES", "FinishKind", "LlmRequest", "LlmResponse",
                           "Provider", "StreamAssembler", "failure_error"),
    "dsh.agent._recorder": ("ABORTED_BEFORE_DISPATCH", "ABORTED_BEFORE_DISPATCH_TEXT", "Recorder",
                           "StepRecorder", "TurnRecorder", "turn_end_reason"),
    "dsh.agent._scripted": ("ScriptedCall", "ScriptedFailure", "ScriptedProvider", "ScriptedReply",
                           "ScriptedStall", "ScriptStep"),
    "dsh.agent._telemetry": ("Telemetry",),
    "dsh.agent._tools": ("DEFAULT_TOOL_TIMEOUT_MS", "TOOL_EFFECTS", "Tool", "ToolContext",
                         "ToolEffect", "ToolOutput", "tool"),
}.items() for name in names}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
