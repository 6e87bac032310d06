"""Vendor the OpenAI Agents SDK's session tests, with DshSession in place of SQLiteSession.

Copies the SDK's runner-level session test files of one released version (from its sdist,
``pip download openai-agents==V --no-deps --no-binary :all:``) into
``tests/adapters/sdk_session_tests/``, each with the SDK's MIT notice on top, and changes only
what :data:`PATCHES` lists: the imports of the SDK's own test helpers move to this package, and
``SQLiteSession`` is imported from ``_substitute`` (a DshSession with SQLiteSession's
constructor). Test bodies are not touched. Tests that look inside SQLiteSession (its sqlite3
connections and tables) are listed in the package's conftest with the reason, and skipped.

Run: ``python tools/vendor/sdk_session_tests.py /tmp/openai_agents-0.24.0``.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

FILES = {  # SDK path -> vendored name
    "tests/test_responses.py": "sdk_responses.py",
    "tests/memory/test_session.py": "test_session.py",
    "tests/memory/test_session_limit.py": "test_session_limit.py",
    "tests/test_tool_batch_failure_history.py": "test_tool_batch_failure_history.py",
    "tests/test_native_tool_failure_history.py": "test_native_tool_failure_history.py",
    "tests/test_tool_failure_boundaries.py": "test_tool_failure_boundaries.py",
    "tests/test_soft_cancel.py": "test_soft_cancel.py",
    "tests/test_max_turns.py": "test_max_turns.py",
    # helpers the two files above import (not collected: their names do not start with test_)
    "tests/model_test_helpers.py": "model_test_helpers.py",
    "tests/test_computer_tool_lifecycle.py": "sdk_computer_tool_lifecycle.py",
    "tests/utils/hitl.py": "utils/hitl.py",
    "tests/utils/simple_session.py": "utils/simple_session.py",
}
EXCERPTS = {  # SDK path -> (vendored name, the top-level classes taken, with the file's imports)
    # the whole file imports further SDK test modules (MCP, apply_patch) that sessions never use
    "tests/test_tool_custom_data.py": ("sdk_tool_custom_data.py", ("RecordingEditor",)),
}
PACKAGE = "tests.adapters.sdk_session_tests"
SUBSTITUTE = f"from {PACKAGE}._substitute import SQLiteSession  # dsh: DshSession\n"
PATCHES: list[tuple[str, str]] = [  # (regex, replacement), applied to every file in order
    (r"from tests\.test_responses import", f"from {PACKAGE}.sdk_responses import"),
    (r"from \.test_responses import", "from .sdk_responses import"),
    (r"from tests\.memory\.test_session import", f"from {PACKAGE}.test_session import"),
    (r"from \.test_computer_tool_lifecycle import", "from .sdk_computer_tool_lifecycle import"),
    (r"from \.test_tool_custom_data import", "from .sdk_tool_custom_data import"),
    (r"^(from agents import [^\n(]*?)SQLiteSession, ", r"\1"),   # one-line import
    (r"^    SQLiteSession,\n", ""),                                 # parenthesised import
]


def header(version: str, sdk_path: str, notice: str, classes: tuple[str, ...] | None) -> str:
    """The comment block on top of a vendored file: origin, what changed, the MIT notice."""
    taken = (f"its imports and the classes {', '.join(classes)}" if classes else "the whole file")
    quoted = "".join(f"# {line}".rstrip() + "\n" for line in notice.strip().splitlines())
    return (f"# Vendored from openai-agents {version}, {sdk_path} ({taken}), by\n"
            f"# tools/vendor/sdk_session_tests.py. Only imports are changed: SQLiteSession is\n"
            f"# dsh's DshSession (see _substitute.py).\n#\n{quoted}\n")


def excerpt(text: str, classes: tuple[str, ...]) -> str:
    """The absolute imports of ``text`` and the source of its top-level ``classes``."""
    tree = ast.parse(text)
    keep = [node for node in tree.body
            if (isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0))
            or (isinstance(node, ast.ClassDef) and node.name in classes)]
    return "\n\n".join(str(ast.get_source_segment(text, node)) for node in keep) + "\n"


def vendor(sdist: Path, out: Path) -> None:
    """Write every file of :data:`FILES` and :data:`EXCERPTS` from ``sdist`` into ``out``."""
    version = sdist.name.rsplit("-", 1)[-1]
    notice = (sdist / "LICENSE").read_text()
    sources = {sdk_path: (name, None) for sdk_path, name in FILES.items()}
    sources.update(EXCERPTS)
    for sdk_path, (name, classes) in sources.items():
        text = (sdist / sdk_path).read_text()
        if classes is not None:
            text = excerpt(text, classes)
        uses = "SQLiteSession" in text
        for pattern, replacement in PATCHES:
            text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
        if uses:
            # After the last top-level import: the module's own names stay where they were.
            last = max(node.end_lineno or 0 for node in ast.parse(text).body
                       if isinstance(node, ast.Import | ast.ImportFrom))
            lines = text.splitlines(keepends=True)
            text = "".join(lines[:last]) + SUBSTITUTE + "".join(lines[last:])
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(header(version, sdk_path, notice, classes) + text)
        print(f"{sdk_path} -> {out / name}")


def main() -> None:
    """Command line: the sdist folder, optionally ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sdist", type=Path, help="the unpacked openai-agents sdist")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2]
                        / "tests" / "adapters" / "sdk_session_tests")
    args = parser.parse_args()
    if not (args.sdist / "LICENSE").exists():
        sys.exit(f"{args.sdist}: not an unpacked openai-agents sdist (no LICENSE)")
    vendor(args.sdist, args.out)


if __name__ == "__main__":
    main()
