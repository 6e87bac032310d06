"""Named points in the loop where a crash test may stop the process (test support only).

The fault-injection suite kills an agent at every point around a tool call: it installs a hook
with :func:`set_failpoint_hook` in the child process, the hook reports the point it reached
(writes a marker) and blocks, and the parent SIGKILLs the child. Without a hook every point is
a no-op costing one global read.

Points (in the order a call passes them):

* ``tool.before-body``: the ``tool/call`` is durable, the body has not started;
* ``tool.after-body``: the body returned, its ``tool/result`` is not appended yet;
* ``recovery.decided``: a resumed agent's ``tool/recovery`` decision is durable, nothing done;
* ``recovery.after-action``: the re-run, reconcile or answer is done, the rewritten result not
  appended yet.
"""

from __future__ import annotations

from dsh._failpoints import failpoint, set_failpoint_hook

__all__ = ["failpoint", "set_failpoint_hook"]
