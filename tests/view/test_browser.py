"""The viewer in a real browser (Playwright on Debian's chromium): content, safety, live updates.

The server is the real `dsh view` command in a child process, over stores built from dsh's own
logs and the corpus; a second child writes a session while the page shows it. Screenshots of
the main pages go to ``$DSH_VIEW_SCREENSHOTS`` (default ``bench/out/screenshots``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh.testing import postgres_unreachable, temporary_postgres_url
from tests.view import stores

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("DSH_VIEW_SCREENSHOTS", ROOT / "bench" / "out" / "screenshots"))

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed "
                       "(apt-get install chromium; .ci/run does)"),
    pytest.mark.skipif(not stores.LOGS.is_dir(), reason="dsh-logs not found"),
]

LIVE_WAIT_MS = 2000
"""How long a committed event may take to appear on an open page (the viewer's promise)."""


class Viewer:
    """A `dsh view` child process; ``url`` is the first line it printed."""

    def __init__(self, store_url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsh.cli", "view", "--store", store_url, "--no-browser",
             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.proc.stderr.read() if \
            self.proc.stderr else ""
        self.base = self.url.split("/?", 1)[0]
        self.token = self.url.rsplit("token=", 1)[1]

    def at(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser-store")
    stores.copy_dsh_logs(root)
    url = f"jsonl:{root}"
    stores.write_hostile(url)
    stores.write_damaged(url, root)
    stores.import_corpus(url, ["claude-code", "codex"])
    return root


@pytest.fixture(scope="module")
def viewer(store_root: Path) -> Iterator[Viewer]:
    v = Viewer(f"jsonl:{store_root}")
    yield v
    v.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.js_errors = errors
    yield page
    context.close()
    assert dialogs == [], f"a dialog fired: {dialogs}"


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def test_sessions_page_lists_the_store(viewer: Viewer, page: Any) -> None:
    page.goto(viewer.url)
    rows = page.locator("table.sessions tbody tr")
    assert rows.count() >= 8
    assert page.locator("a[href='/s/s5-compaction']").is_visible()
    assert "fork of s1-normal @134" in page.locator("table.sessions").inner_text()
    shot(page, "sessions")
    page.fill("form.filters input[name=q]", "fork")
    page.click("form.filters button")
    assert page.locator("table.sessions tbody tr").count() == 1


def test_sessions_sort_by_a_column_and_filter_by_source(viewer: Viewer, page: Any) -> None:
    page.goto(viewer.url)
    headers = page.locator("table.sessions thead th").all_inner_texts()
    assert headers[:11] == ["id", "title", "source", "model", "cwd", "first activity (UTC)",
                            "last activity (UTC) ▼", "turns", "events", "size", "created (UTC)"]
    row = page.locator("table.sessions tbody tr", has=page.locator("a[href='/s/s1-normal']"))
    cells = row.locator("td").all_inner_texts()
    assert "deepseek" in cells[3] and re.fullmatch(r"\d+\.\d KB", cells[9])
    page.click("table.sessions th a[data-sort=events]")
    page.locator("th[aria-sort=descending] a[data-sort=events]").wait_for()
    column = page.locator("table.sessions tbody td:nth-child(9)").all_inner_texts()
    counts = [int(text.replace(",", "")) for text in column]
    assert len(counts) >= 8 and counts == sorted(counts, reverse=True)
    page.click("table.sessions th a[data-sort=events]")  # again: the other way round
    page.locator("th[aria-sort=ascending] a[data-sort=events]").wait_for()
    column = page.locator("table.sessions tbody td:nth-child(9)").all_inner_texts()
    assert [int(text.replace(",", "")) for text in column] == sorted(counts)
    page.select_option("form.filters select[name=source]", "codex")
    page.click("form.filters button")
    page.wait_for_load_state()
    sources = page.locator("table.sessions tbody td:nth-child(3)").all_inner_texts()
    assert sources and set(sources) == {"codex"}
    assert "sort=events" in page.url and "dir=asc" in page.url  # the sort is kept


def test_session_shows_transcript_and_model_view_side_by_side(viewer: Viewer, page: Any) -> None:
    page.goto(viewer.at("/s/s1-normal"))
    transcript = page.locator("section.transcript")
    assert "Which TypeScript files are in src/" in transcript.inner_text()
    model = page.locator("#model .model-view")
    model.wait_for()
    text = model.inner_text()
    assert re.search(r"Request as of #\d+ · answered by #\d+", text)
    assert "deepseek" in text and "tools" in text and "user" in text
    box_t, box_m = transcript.bounding_box(), page.locator("#model").bounding_box()
    assert box_t["x"] + box_t["width"] <= box_m["x"]  # side by side
    shot(page, "session")
    # another request: its own messages, fewer than the last one's
    first = page.locator("a.js-model").first
    seq = first.get_attribute("href").split("/model/")[1].split("?")[0]
    first.click()  # the page's CSP forbids eval, so wait on the DOM, not on a JS predicate
    page.locator(f"#model .model-view[data-seq='{seq}']").wait_for()
    assert 0 < page.locator("#model li.msg").count() < text.count("#") + 1
    assert page.js_errors == []


def test_compaction_checkpoint_expands_to_the_span_it_shadows(viewer: Viewer, page: Any) -> None:
    page.goto(viewer.at("/s/s5-compaction"))
    checkpoint = page.locator("article.k-checkpoint").first
    checkpoint.scroll_into_view_if_needed()
    assert "compaction checkpoint" in checkpoint.inner_text()
    shadowed = checkpoint.locator("details.shadowed")
    assert not shadowed.locator("article").first.is_visible()
    shadowed.locator("> summary").click()
    first = shadowed.locator("article.k-message").first
    assert first.is_visible() and first.inner_text().strip()
    SHOTS.mkdir(parents=True, exist_ok=True)
    checkpoint.screenshot(path=str(SHOTS / "compaction.png"))


def test_a_long_log_without_a_restore_point_shows_the_last_messages_then_the_header(
        tmp_path: Path, page: Any) -> None:
    """The model pane reads back first; the header part arrives in place (view.md)."""
    import dsh

    url = f"jsonl:{tmp_path / 'long'}"
    with dsh.open(url) as store:
        s = store.session("long", header={"createdAt": 1_767_225_600_000})
        s.append("request/header", {"header": {"config": {"provider": "acme",
                                                          "model": "m-long"}},
                                    "reason": "initial"})
        stores.write_turns(s, 1400)  # 8,401 events: more than the pane folds at once
    for restore_point in (tmp_path / "long").rglob("*.ckpt"):
        restore_point.unlink()  # as an import's log: no restore point
    v = Viewer(url)
    try:
        page.goto(v.at("/s/long"))
        pane = page.locator("#model-body")
        pane.locator(".model-header.loaded").wait_for(timeout=60_000)
        assert "acme/m-long" in pane.inner_text()
        assert "2,799 messages; the first 2,599 are not shown" in pane.inner_text()
        assert pane.locator("li.msg").count() == 200 and "question 1400" in pane.inner_text()
        assert page.js_errors == []
    finally:
        v.stop()


def test_crash_repair_is_marked(viewer: Viewer, page: Any) -> None:
    page.goto(viewer.at("/s/s2a-crash-after-tool-call"))
    # the stored log ends inside the turn: the page says a resume will close it
    assert "is still open" in page.locator("article.k-open-turn").inner_text()
    page.goto(viewer.at("/s/s4-fork-of-s1"))
    assert "forked here" in page.locator("article.k-fork").inner_text()


def test_fork_tree_and_diff(viewer: Viewer, page: Any) -> None:
    page.goto(viewer.at("/s/s4-fork-of-s1/tree"))
    tree = page.locator("ul.tree")
    assert "s1-normal" in tree.inner_text() and "cut at #134" in tree.inner_text()
    shot(page, "tree")
    page.select_option("select[name=a]", "s1-normal")
    page.select_option("select[name=b]", "s4-fork-of-s1")
    page.click("form.diffform button")
    assert page.locator("#common").inner_text() == "135"
    panes = page.locator(".panes section.pane")
    assert panes.count() == 2 and "end-seed" not in panes.nth(1).inner_text()
    assert "forked here" in panes.nth(1).inner_text()
    shot(page, "diff")


def test_search_finds_message_text_and_links_to_it(viewer: Viewer, page: Any) -> None:
    page.goto(viewer.url)
    page.fill("header.top input[name=q]", "wc -l")
    page.click("header.top form.search button")
    # the store's index matches words ("wc", then "l" as a prefix): a hit holds the command
    hit = page.locator("ol.hits li.hit", has_text="wc -l").first
    assert hit.locator("mark").first.inner_text().strip()
    hit.locator("a").first.click()
    page.wait_for_load_state()
    assert re.search(r"#seq-\d+$", page.url)
    assert page.locator("article:target").is_visible()


def test_injected_script_and_image_are_text_and_fire_nothing(viewer: Viewer, page: Any) -> None:
    page.goto(viewer.at("/s/hostile"))
    text = page.locator("section.transcript").inner_text()
    assert stores.HOSTILE_SCRIPT in text and stores.HOSTILE_IMG in text
    assert "javascript:alert('xss-link')" in text
    assert page.locator("section.transcript img").count() == 0
    assert page.locator("section.transcript a[href^='javascript:']").count() == 0
    assert "\\x1b[2J" in text and "\\u202eevil" in text
    assert "show all" in text  # the 10 MB line is clipped
    page.wait_for_timeout(300)  # an onerror would have fired by now
    shot(page, "hostile")


def test_missing_session_is_a_404_page_that_links_back(viewer: Viewer, page: Any) -> None:
    response = page.goto(viewer.at("/s/no-such-session"))
    assert response.status == 404
    assert "no session 'no-such-session'" in page.locator("main").inner_text()
    page.click("text=← all sessions")
    assert page.locator("table.sessions").is_visible()


def test_damaged_session_names_the_damage(viewer: Viewer, page: Any,
                                          store_root: Path) -> None:
    page.goto(viewer.at("/s/damaged"))
    damage = page.locator("#damage").inner_text()
    assert "LOG_CORRUPT" in damage and "line: 9" in damage and "session.jsonl" in damage
    assert "question 1" in page.locator("section.transcript").inner_text()
    shot(page, "damaged")


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_a_session_being_written_updates_in_place(tmp_path: Path, browser: Any,
                                                  backend: str) -> None:
    with contextlib.ExitStack() as stack:
        if backend == "postgres":
            reason = postgres_unreachable()
            if reason is not None:
                pytest.skip(reason)
            url = stack.enter_context(temporary_postgres_url())
        else:
            url = f"jsonl:{tmp_path / 'live'}" if backend == "jsonl" else \
                f"sqlite:{tmp_path / 'l.db'}"
        _watch_live_session(url, browser)


def _watch_live_session(url: str, browser: Any) -> None:
    """A child writes turns to ``url`` while a page shows the session: each within 2 s."""
    writer = subprocess.Popen([sys.executable, "-m", "tests.view.live_writer", url, "live-1"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert writer.stdout is not None and writer.stdin is not None
    viewer = None
    try:
        assert writer.stdout.readline().strip() == "ready"
        viewer = Viewer(url)
        context = browser.new_context()
        page = context.new_page()
        page.goto(viewer.at("/s/live-1"))
        assert "the first answer" in page.locator("#entries").inner_text()
        for marker in ("live-update-one", "live-update-two"):
            writer.stdin.write(marker + "\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "flushed"
            page.locator(f"#entries >> text={marker}").wait_for(timeout=LIVE_WAIT_MS)
        assert page.locator("#event-count").inner_text() == "18"
        context.close()
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
        writer.stdout.close()
        if viewer is not None:
            viewer.stop()
