"""dsh as the session memory of agent frameworks (each an optional extra).

* :mod:`dsh.adapters.openai_agents` — ``DshSession``, the OpenAI Agents SDK ``Session``
  (``pip install 'dsh-session[openai-agents]'``);
* :mod:`dsh.adapters.langchain` — ``DshChatMessageHistory``, a LangChain
  ``BaseChatMessageHistory`` (``[langchain]``);
* :mod:`dsh.adapters.pydantic_ai` — ``load_messages`` / ``record_messages`` between a dsh
  session and Pydantic AI's ``list[ModelMessage]`` (``[pydantic-ai]``).

Every adapter writes core dsh events (turns, steps, user/assistant messages, ``tool/call`` +
``tool/result`` pairs), so the model view, ``dsh show``, crash repair, fork and compaction work
on framework sessions, and keeps each framework record verbatim beside its core event so the
framework reads back exactly what it wrote. Importing this package imports no framework; each
submodule imports its own when it is imported.

:func:`apply_old_marks` puts the removals an earlier dsh only marked (``<fmt>/clear``,
``<fmt>/pop``) onto a restored session's surface in memory (docs/formats.md#old-adapter-marks).
"""

# the session layer's own function: importing this package loads no adapter module
from dsh.session import apply_old_marks as apply_old_marks

__all__ = ["apply_old_marks"]
