"""Logs written before clears and pops went onto the surface (a12a84a..bef2f0b^).

That dsh recorded a LangChain ``clear()`` as an ignorable ``langchain/clear {through}`` mark
after ending the turn, and a ``pop`` as ``<fmt>/pop {seq, index}``: the adapter's own read
honours them, so the model view must too (docs/forgetting.md#logs-from-before-surface-removals).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.adapters.conftest import dsh_messages
from tests.adapters.test_cleared import SECRET


def _old_cleared(store: str) -> None:
    """Session ``old``: the secret, then a clear the way a12a84a's ``LiveLog.clear`` wrote it."""
    from dsh.adapters.langchain import DshChatMessageHistory

    history = DshChatMessageHistory("old", store)
    history.add_user_message(f"my password is {SECRET}")
    history.add_ai_message("noted")
    shaper = history._log.open()
    shaper.end_turn()
    shaper.mark("langchain/clear", {"through": shaper.session.seq - 1})  # the old shape
    history.close()


def test_an_old_clear_mark_leaves_dsh_messages(tmp_path: Path) -> None:
    from dsh.adapters.langchain import DshChatMessageHistory

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _old_cleared(store)
    again = DshChatMessageHistory("old", store)
    assert again.messages == []  # the adapter honoured the old mark already
    again.close()
    assert SECRET not in json.dumps(dsh_messages("old", store))


def test_an_old_pop_mark_leaves_dsh_messages(tmp_path: Path) -> None:
    import asyncio

    from dsh.adapters.openai_agents import DshSession

    store = f"sqlite:///{tmp_path / 'sessions.db'}"

    async def fill() -> None:
        session = DshSession("popped", store)
        await session.add_items([{"role": "user", "content": f"my password is {SECRET}"},
                                 {"role": "assistant", "content": "noted"}])
        shaper = session._log.open()
        seq = next(e["seq"] for e in shaper.session.events if e["type"] == "user/message")
        shaper.end_turn()
        shaper.mark("openai-agents/pop", {"seq": seq, "index": 0})  # a12a84a's pop_item
        assert SECRET not in json.dumps(await session.get_items())
        session.close()

    asyncio.run(fill())
    sent = json.dumps(dsh_messages("popped", store))
    assert SECRET not in sent and "noted" in sent
