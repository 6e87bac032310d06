# Vendored from openai-agents 0.24.0, tests/test_tool_custom_data.py (its imports and the classes
# RecordingEditor), by tools/vendor/sdk_session_tests.py. Only imports are changed: SQLiteSession is
# dsh's DshSession (see _substitute.py).
#
# MIT License
#
# Copyright (c) 2025 OpenAI
#
# Permission is hereby granted, free of charge, to any person obtaining a copy
# of this software and associated documentation files (the "Software"), to deal
# in the Software without restriction, including without limitation the rights
# to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
# copies of the Software, and to permit persons to whom the Software is
# furnished to do so, subject to the following conditions:
#
# The above copyright notice and this permission notice shall be included in all
# copies or substantial portions of the Software.
#
# THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
# IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
# FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
# AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
# LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
# OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
# SOFTWARE.

from __future__ import annotations

from typing import Any, cast

import pytest

from openai.types.responses import ResponseCustomToolCall

from openai.types.responses.response_computer_tool_call import (
    ActionScreenshot,
    ResponseComputerToolCall,
)

from agents import (
    Agent,
    ApplyPatchTool,
    Computer,
    ComputerTool,
    CustomTool,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
    UserError,
    function_tool,
)

from agents.editor import ApplyPatchOperation, ApplyPatchResult

from agents.items import ToolCallOutputItem

from agents.run_internal.run_loop import (
    ToolRunApplyPatchCall,
    ToolRunComputerAction,
)

from agents.run_internal.run_steps import ToolRunCustom

from agents.run_internal.tool_actions import (
    ApplyPatchAction,
    ComputerAction,
    CustomToolAction,
)

from agents.testing import ScriptedModel

from agents.tool_context import ToolContext

class RecordingEditor:
    def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return ApplyPatchResult(output=f"Updated {operation.path}")

    def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return ApplyPatchResult(output=f"Created {operation.path}")

    def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return ApplyPatchResult(output=f"Deleted {operation.path}")
