"""The docs travel with the code: every error code is documented, every cited heading exists."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SRC = REPO / "src" / "dsh"

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, numbered as GitHub numbers repeats."""
    seen: dict[str, int] = defaultdict(int)
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen[base]
        seen[base] += 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_slug_follows_github() -> None:
    assert slug("Request == projection") == "request--projection"
    assert slug("`session/end-seed`") == "sessionend-seed"
    assert slug("import/\\<format\\>/\\<kind\\>") == "importformatkind"
    assert slug("PostgreSQL: one session, one writer") == "postgresql-one-session-one-writer"


# --- links inside the docs and the README ------------------------------------------------------

_LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def test_links_in_docs_and_readme_name_existing_files_and_headings() -> None:
    broken = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target, anchor in _LINK.findall(page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file = (page.parent / target).resolve() if target else page
            if not file.exists():
                broken.append(f"{page.name}: {target} does not exist")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.name}: {target or page.name}#{anchor} has no such heading")
    assert broken == []


# --- every error code is documented ------------------------------------------------------------

_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_CLI_LINE = re.compile(r"error\[([A-Z][A-Z0-9_]*)\]")


def _values(node: ast.expr, assigned: dict[str, list[ast.expr]], depth: int = 0) -> list[str]:
    """The string constants an expression passed as an error code can evaluate to."""
    if depth > 5:
        return []
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.IfExp):
        return _values(node.body, assigned, depth + 1) + _values(node.orelse, assigned, depth + 1)
    if isinstance(node, ast.BoolOp):
        return [v for value in node.values for v in _values(value, assigned, depth + 1)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str":
        return [v for arg in node.args for v in _values(arg, assigned, depth + 1)]
    if isinstance(node, ast.Name):
        return [v for value in assigned.get(node.id, []) for v in _values(value, assigned,
                                                                            depth + 1)]
    return []


def _is_code_param(name: str) -> bool:
    return name == "code" or name.endswith("_code")


def _codes_in(path: Path) -> dict[str, int]:
    """Codes ``path`` raises: class ``default_code``s, ``code=`` arguments (through constants,
    conditionals and local helpers that take a code), and CLI ``error[CODE]`` lines."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    assigned: dict[str, list[ast.expr]] = defaultdict(list)
    helpers: dict[str, tuple[int, str]] = {}
    found: dict[str, int] = {}

    def note(expr: ast.expr, line: int) -> None:
        for value in _values(expr, assigned):
            found.setdefault(value, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id].append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.value is not None:
            assigned[node.target.id].append(node.value)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name != "__init__":
            positional = [*node.args.posonlyargs, *node.args.args]
            for index, arg in enumerate(positional):
                if _is_code_param(arg.arg):
                    helpers[node.name] = (index, arg.arg)
            for arg, default in zip(reversed(positional), reversed(node.args.defaults),
                                    strict=False):
                if _is_code_param(arg.arg):
                    note(default, node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "default_code" for t in stmt.targets):
                    note(stmt.value, stmt.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            for keyword in node.keywords:
                if keyword.arg is not None and (keyword.arg == "code" or (
                        name in helpers and keyword.arg == helpers[name][1])):
                    note(keyword.value, node.lineno)
            if name in helpers and len(node.args) > helpers[name][0]:
                note(node.args[helpers[name][0]], node.lineno)
    for match in _CLI_LINE.finditer(source):
        found.setdefault(match.group(1), source.count("\n", 0, match.start()) + 1)
    return {code: line for code, line in found.items() if _CODE.match(code) and code != "CODE"}


def raised_codes() -> dict[str, str]:
    """Every error code raised in ``src/dsh``, with one place that raises it."""
    codes: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        for code, line in _codes_in(path).items():
            codes.setdefault(code, f"{path.relative_to(REPO)}:{line}")
    return codes


def test_the_code_collector_sees_codes_raised_through_helpers() -> None:
    codes = raised_codes()
    for code in ("SEQ_NOT_CONTIGUOUS",  # session's _reject(message, code)
                 "SURFACE",  # surface's _reject default
                 "FORMAT_NEWER", "FORMAT_OLDER",  # code = "..." then code=code
                 "IMPORT_UNMAPPED",  # a module constant
                 "DATABASE_BUSY", "SESSION_DISPOSED",  # conditional expressions
                 "QUOTA_EXHAUSTED",  # a nested helper's dsh_code parameter
                 "USAGE", "BUG",  # the CLI's one-line errors
                 "LEASE_LOST"):  # a class default
        assert code in codes, code


def test_every_error_code_raised_in_src_is_in_the_error_reference() -> None:
    reference = (DOCS / "errors.md").read_text(encoding="utf-8")
    missing = [f"{code} ({where})" for code, where in sorted(raised_codes().items())
               if f"`{code}`" not in reference]
    assert missing == [], "add these codes to docs/errors.md"


def test_every_error_class_has_a_section_in_the_error_reference() -> None:
    import dsh
    import dsh.adapters  # adapter errors are DshErrors too
    import dsh.agent

    classes: set[type] = set()
    todo: list[type] = [dsh.DshError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("dsh") and cls not in classes:
            classes.add(cls)
            todo.extend(cls.__subclasses__())
    reference = (DOCS / "errors.md").read_text(encoding="utf-8")
    sections = anchors(DOCS / "errors.md")
    missing = sorted(cls.__name__ for cls in classes if cls.__name__.lower() not in sections
                     and f"`{cls.__name__}`" not in reference)
    assert missing == []


# --- citations in the code point into docs/ ----------------------------------------------------

_CODE_FILES = ("*.py", "*.pyi", "*.c")
_DOC_REF = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?")
# Built from pieces so that this file does not match its own patterns.
_SECTION = chr(0xA7)
_OUTSIDE = re.compile("|".join([rf"spec {_SECTION}", rf"DESIGN {_SECTION}", rf"STYLE {_SECTION}",
                                "seed" + " ch", rf"{_SECTION}\s*\d"]))
_ISSUE = re.compile(r"\bissues?\s+#?\d+|\((?:see\s+)?#\d+\)|\bPR\s*#\d+", re.IGNORECASE)


def _code_files() -> list[Path]:
    return sorted(path for top in ("src", "tests") for pattern in _CODE_FILES
                  for path in (REPO / top).rglob(pattern) if "fixtures" not in path.parts)


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """The comments and string-statement texts of a Python file, with their first line."""
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".c":
        return [(1, source)]
    found = [(token.start[0], token.string)
             for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            found.append((node.lineno, node.value.value))
    return found


def test_every_docs_reference_in_the_code_names_an_existing_page_and_heading() -> None:
    headings = {page.name: anchors(page) for page in DOCS.glob("*.md")}
    broken, count = [], 0
    for path in _code_files():
        text = path.read_text(encoding="utf-8")
        for match in _DOC_REF.finditer(text):
            count += 1
            page, anchor = match.groups()
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(REPO)}:{line}: {match.group(0)}"
            if page not in headings:
                broken.append(f"{where}: no page docs/{page}")
            elif anchor and anchor not in headings[page]:
                broken.append(f"{where}: docs/{page} has no heading with that anchor")
    assert count > 300  # the citations are there to be checked
    assert broken == []


def test_no_code_cites_a_document_outside_the_repository() -> None:
    found = [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}: "
             f"{match.group(0)!r}"
             for path in _code_files()
             for text in [path.read_text(encoding="utf-8")]
             for match in _OUTSIDE.finditer(text)]
    assert found == [], "cite a heading of docs/ (docs/<page>.md#<anchor>) instead"


def test_no_comment_or_docstring_cites_an_issue_number() -> None:
    found = [f"{path.relative_to(REPO)}:{line}: {match.group(0)!r}"
             for path in _code_files()
             for line, text in _comments_and_docstrings(path)
             for match in _ISSUE.finditer(text)]
    assert found == [], "say what the test checks, not which issue asked for it"


def test_the_citation_checks_catch_what_they_look_for() -> None:
    assert _OUTSIDE.search("(core spec " + _SECTION + "9.2)")
    assert _OUTSIDE.search("(" + _SECTION + "4.6)")
    assert _OUTSIDE.search("(seed" + " ch. 28)")
    assert not _OUTSIDE.search("(docs/rules.md#repair)")
    assert _ISSUE.search("(issue 9 item 20)") and _ISSUE.search("see #19") is None
    assert _ISSUE.search("(see #19)") and not _ISSUE.search("events #0-#4")
    assert _DOC_REF.fullmatch("docs/rules.md#request--projection")


def test_events_page_lists_every_event_type_in_one_table() -> None:
    from dsh.agent._effects import EFFECT_EVENT_TYPES
    from dsh.session._events import KNOWN_EVENT_TYPES

    page = (Path(__file__).resolve().parents[1] / "docs" / "events.md").read_text()
    table = page[page.index("## Every event type"):page.index("## The envelope")]
    for name in sorted({*KNOWN_EVENT_TYPES, *EFFECT_EVENT_TYPES, "import/source",
                        "quarantine/apply", "quarantine/release", "redaction/applied",
                        "store/trashed", "store/restored", "store/archived", "store/erased",
                        "store/retention"}):
        assert f"`{name}`" in table, name
