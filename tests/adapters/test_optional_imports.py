"""`import dsh` (and the adapters package) imports no framework; each extra is separate."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("agents", "langchain_core", "langgraph", "langchain", "pydantic_ai", "openai",
              "pydantic")


def imported_after(statement: str) -> set[str]:
    code = (f"import sys; {statement}; "
            f"print(' '.join(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def test_import_dsh_pulls_no_framework() -> None:
    assert imported_after("import dsh") == set()
    assert imported_after("import dsh.adapters") == set()
    assert imported_after("import dsh.adapters._log") == set()


def test_each_adapter_imports_its_own_framework() -> None:
    assert "agents" in imported_after("import dsh.adapters.openai_agents")
    assert "langchain_core" in imported_after("import dsh.adapters.langchain")
    assert "pydantic_ai" in imported_after("import dsh.adapters.pydantic_ai")
    assert "pydantic_ai" in imported_after("import dsh.adapters.pydantic_ai_store")
    assert "agents" not in imported_after("import dsh.adapters.pydantic_ai_store")
    langgraph = imported_after("import dsh.adapters.langgraph")
    assert "langgraph" in langgraph and "langchain" not in langgraph


def test_langgraph_without_its_extra_names_the_langgraph_extra() -> None:
    # Neither langgraph nor langchain-core installed (the langgraph extra brings both): the
    # message named the langchain extra, which installs langchain-core alone, so the next
    # import failed again, now naming langgraph.
    code = ("import sys; sys.modules['langgraph'] = None; sys.modules['langchain_core'] = None\n"
            "try:\n    import dsh.adapters.langgraph\n"
            "except ImportError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("dsh.adapters.langgraph needs LangGraph: ")
    assert "[langgraph]" in out and "[langchain]" not in out
