"""The agent loop of dsh: provider protocol, scripted provider, recorder, tools, loop, resume.

Everything the loop writes goes through one recording path (:mod:`dsh.agent._recorder`), so the
log it produces is well formed by construction (persistence spec §8.4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh._errors import AgentError, LlmFailureError
from dsh._lazy import lazy_exports

if TYPE_CHECKING:
    from dsh.agent._builtin import (
        ShellApproval,
        ShellRequest,
        refuse_all,
        shell_tool,
        workspace_tools,
    )
    from dsh.agent._inbox import Inbox, InboxTarget
    from dsh.agent._loop import Agent, InvariantStats, RetryPolicy, TurnResult
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
    from dsh.agent._tools import DEFAULT_TOOL_TIMEOUT_MS, Tool, ToolContext, ToolOutput, tool

__all__ = [
    "ABORTED_BEFORE_DISPATCH",
    "ABORTED_BEFORE_DISPATCH_TEXT",
    "DEFAULT_TOOL_TIMEOUT_MS",
    "RETRYABLE_FAILURE_CODES",
    "Agent",
    "AgentError",
    "FinishKind",
    "Inbox",
    "InboxTarget",
    "InvariantStats",
    "LlmFailureError",
    "LlmRequest",
    "LlmResponse",
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
    "ToolOutput",
    "Telemetry",
    "TurnRecorder",
    "TurnResult",
    "failure_error",
    "refuse_all",
    "shell_tool",
    "tool",
    "turn_end_reason",
    "workspace_tools",
]

# PEP 562: each name loads its module on first use, so importing a light submodule (the CLI's
# `dsh.agent.providers._config`) does not load the loop, its tools and asyncio.
_LAZY: dict[str, str] = {name: module for module, names in {
    "dsh.agent._builtin": ("ShellApproval", "ShellRequest", "refuse_all", "shell_tool",
                          "workspace_tools"),
    "dsh.agent._inbox": ("Inbox", "InboxTarget"),
    "dsh.agent._loop": ("Agent", "InvariantStats", "RetryPolicy", "TurnResult"),
    "dsh.agent._provider": ("RETRYABLE_FAILURE_CODES", "FinishKind", "LlmRequest", "LlmResponse",
                           "Provider", "StreamAssembler", "failure_error"),
    "dsh.agent._recorder": ("ABORTED_BEFORE_DISPATCH", "ABORTED_BEFORE_DISPATCH_TEXT", "Recorder",
                           "StepRecorder", "TurnRecorder", "turn_end_reason"),
    "dsh.agent._scripted": ("ScriptedCall", "ScriptedFailure", "ScriptedProvider", "ScriptedReply",
                           "ScriptedStall", "ScriptStep"),
    "dsh.agent._telemetry": ("Telemetry",),
    "dsh.agent._tools": ("DEFAULT_TOOL_TIMEOUT_MS", "Tool", "ToolContext", "ToolOutput", "tool"),
}.items() for name in names}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
