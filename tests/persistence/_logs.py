"""The log builders now ship in :mod:`dsh.testing._logs`; re-exported for the older tests."""

from dsh.testing._logs import (
    CREATED_AT,
    CWD,
    LogBuilder,
    assistant,
    fixed_clock,
    frozen,
    header,
    make,
    plain,
    tool_result,
    user,
)

__all__ = ["CREATED_AT", "CWD", "LogBuilder", "assistant", "fixed_clock", "frozen", "header",
           "make", "plain", "tool_result", "user"]
