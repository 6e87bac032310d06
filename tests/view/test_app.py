"""The viewer's pages over real stores, through its ASGI app (no browser): content and safety."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

import dsh
from dsh import ConfigError
from dsh.transcript import ModelRequest
from dsh.view import ViewStore, create_app, is_loopback, serve
from dsh.view._app import CSP
from tests.view import stores

pytestmark = [pytest.mark.skipif(not stores.LOGS.is_dir(), reason="dsh-logs not found"),
              pytest.mark.no_speedups]

TOKEN = "test-token-1234"


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    stores.copy_dsh_logs(root)
    url = f"jsonl:{root}"
    stores.write_hostile(url)
    stores.write_damaged(url, root)
    return root


@pytest.fixture(scope="module")
def client(store_root: Path) -> Iterator[TestClient]:
    store = ViewStore(f"jsonl:{store_root}")
    with TestClient(create_app(store, token=TOKEN)) as c:
        assert c.get(f"/?token={TOKEN}").status_code == 200  # sets the cookie
        yield c
    store.close()


def test_every_page_needs_the_token_and_carries_a_strict_csp(store_root: Path) -> None:
    store = ViewStore(f"jsonl:{store_root}")
    with TestClient(create_app(store, token=TOKEN)) as c:
        refused = c.get("/s/s1-normal")
        assert refused.status_code == 403 and "needs its token" in refused.text
        assert c.get("/?token=wrong").status_code == 403
        ok = c.get(f"/?token={TOKEN}")
        assert ok.status_code == 200
        assert ok.headers["content-security-policy"] == CSP
        assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
        assert ok.headers["x-content-type-options"] == "nosniff"
        assert "HttpOnly" in ok.headers["set-cookie"]
        assert c.get("/s/s1-normal").status_code == 200  # the cookie carries the token now
        assert c.get("/static/view.js").headers["content-security-policy"] == CSP
    store.close()


def test_pages_hold_no_inline_script_or_style_and_load_nothing_from_elsewhere(
        client: TestClient) -> None:
    for path in ("/", "/s/s5-compaction", "/s/s4-fork-of-s1/tree", "/s/hostile"):
        html = client.get(path).text
        assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/static/view.js" defer>']
        assert "<style" not in html and " style=" not in html and " on" + "click" not in html
        assert not re.search(r"(src|href)=\"(https?:)?//", html)


def test_session_list_shows_each_session_with_its_lineage(client: TestClient) -> None:
    html = client.get("/").text
    for sid in ("s1-normal", "s4-fork-of-s1", "s5-compaction", "s2a-crash-after-tool-call",
                "hostile"):
        assert f'href="/s/{sid}"' in html
    assert "fork of s1-normal @134" in html
    assert "cannot be listed" in html  # the damaged log is named, the others still listed
    filtered = client.get("/?q=fork").text
    assert 'href="/s/s4-fork-of-s1"' in filtered and 'href="/s/s5-compaction"' not in filtered


def test_injected_markup_and_terminal_escapes_are_shown_as_text(client: TestClient) -> None:
    html = client.get("/s/hostile").text
    assert "&lt;script&gt;alert(&#39;xss-script&#39;)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=&#34;alert(&#39;xss-img&#39;)&#34;&gt;" in html
    assert "javascript:" not in re.sub(r"&lt;a href=&#34;javascript:", "", html)
    assert "<img src=x" not in html and "alert('xss" not in html
    assert "\\x1b[2J" in html and "\\u202eevil" in html
    assert "\x1b" not in html and "\u202e" not in html
    # the 10 MB line is clipped, with a way to all of it
    assert len(html) < 200_000
    assert "show all (0 more lines, 10,481,760 more characters)" in html


def test_a_message_of_many_blocks_is_clipped_with_a_way_to_all_of_them(tmp_path: Path) -> None:
    # before: every block was rendered, so one imported message of 100,000 one-line blocks
    # made the session page, and the model pane, 3.5 MB
    url = f"jsonl:{tmp_path / 'store'}"
    with dsh.open(url) as opened:
        s = opened.session("many")
        s.append("turn/start", {"turn": 1})
        s.append("step/start", {"turn": 1, "step": 1})
        s.append("user/message", {"content": [{"type": "text", "text": f"line {i}"}
                                              for i in range(5000)],
                                  "source": {"kind": "user"}, "role": "user", "id": "u1"},
                 surface_op="append")
        s.append("step/end", {"turn": 1, "step": 1})
        s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    store = ViewStore(url)
    with TestClient(create_app(store, token=TOKEN)) as c:
        page = c.get(f"/s/many?token={TOKEN}").text
        assert "line 39<" in page and "line 40<" not in page and len(page) < 50_000
        assert 'href="/s/many/e/2/text">show all (4,960 more blocks)</a>' in page
        model = c.get("/s/many/model/4?fragment=1").text
        assert "line 40<" not in model and "show all (4,960 more blocks)" in model
        full = c.get("/s/many/e/2/text").text
        assert "line 4999<" in full and "more blocks" not in full
    store.close()


def test_missing_session_and_route_are_404_pages_that_link_back(client: TestClient) -> None:
    for path in ("/s/no-such-session", "/s/s1-normal/e/99999", "/nowhere"):
        page = client.get(path)
        assert page.status_code == 404
        assert 'href="/"' in page.text and "Not found" in page.text


def test_damaged_session_shows_what_is_readable_and_names_the_damage(
        client: TestClient, store_root: Path) -> None:
    page = client.get("/s/damaged")
    assert page.status_code == 200
    html = page.text
    assert 'id="damage"' in html and "LOG_CORRUPT" in html
    path = next(store_root.rglob("damaged/session.jsonl"))
    assert str(path) in html and "line: 9" in html
    assert "question 1" in html and "answer 1" in html  # the events before the damage
    assert "question 2" not in html


def test_a_fifo_or_link_where_a_log_belongs_is_a_damage_page_not_a_server_error(
        tmp_path: Path) -> None:
    # before: /s/ID, its tree and a diff with it were 500 pages ("This page failed")
    root = tmp_path / "store"
    url = f"jsonl:{root}"
    with dsh.open(url) as opened:
        for sid in ("fine", "piped", "linked"):
            stores.write_turns(opened.session(sid), 2)
    logs = {p.parent.name: p for p in root.rglob("session.jsonl")}
    logs["piped"].unlink()
    os.mkfifo(logs["piped"])
    logs["linked"].unlink()
    logs["linked"].symlink_to(logs["fine"])
    store = ViewStore(url)
    with TestClient(create_app(store, token=TOKEN)) as c:
        for sid, code in (("piped", "NOT_A_FILE"), ("linked", "SYMLINK")):
            page = c.get(f"/s/{sid}?token={TOKEN}")
            assert page.status_code == 200 and 'id="damage"' in page.text
            assert code in page.text and "This page failed" not in page.text
            assert c.get(f"/s/{sid}/tree").status_code == 200
            assert c.get(f"/diff?a=fine&b={sid}").status_code == 200
        assert c.get("/s/nowhere").status_code == 404
    store.close()


def test_raw_event_and_permalinks(client: TestClient) -> None:
    html = client.get("/s/s1-normal").text
    seq = int(re.findall(r'<article class="entry k-message role-user" id="seq-(\d+)"', html)[0])
    assert f'href="#seq-{seq}"' in html
    raw = client.get(f"/s/s1-normal/e/{seq}")
    assert f"&#34;seq&#34;: {seq}" in raw.text and "user/message" in raw.text
    as_json = client.get(f"/s/s1-normal/e/{seq}?format=json").json()
    assert (as_json["seq"], as_json["type"]) == (seq, "user/message")
    # a seq on another page is served by the page holding it
    assert f'id="seq-{seq}"' in client.get(f"/s/s1-normal?at={seq}").text


def test_model_view_at_a_request_shows_its_messages_and_header(client: TestClient) -> None:
    page = client.get("/s/s1-normal").text
    match = re.search(r'data-src="(/s/s1-normal/model/(\d+)\?answer=(\d+)&amp;fragment=1)"', page)
    assert match
    fragment = client.get(match.group(1).replace("&amp;", "&")).text
    assert f"Request as of #{match.group(2)}" in fragment
    assert "deepseek" in fragment and "<dt>tools</dt>" in fragment
    assert 'class="msg role-user"' in fragment and "usage" in fragment


def test_model_views_continue_from_a_kept_fold_and_show_what_a_fresh_fold_shows(
        store_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Later model views fold on from a kept one (docs/view.md#the-model-view)."""
    from dsh.view import _app

    monkeypatch.setattr(_app, "PAGE_EVENTS", 40)  # so the view keeps a fold a page before
    sid = "s5-compaction"
    with dsh.open(f"jsonl:{store_root}") as opened:
        count = len(opened.read(sid).stored_events)
    assert count > 100
    seqs = [count - 1, count - 30, count - 45, count - 1, 2]
    real = _app.model_request
    calls: list[tuple[int, int | None]] = []

    def spy(events: object, seq: int, **kw: object) -> object:
        since = kw.get("since")
        calls.append((seq, since.seq if isinstance(since, ModelRequest) else None))
        return real(events, seq, **kw)  # type: ignore[arg-type]  # the real signature

    monkeypatch.setattr(_app, "model_request", spy)

    def panes(keep: bool) -> list[str]:
        store = ViewStore(f"jsonl:{store_root}")
        if not keep:
            monkeypatch.setattr(store, "keep_fold", lambda *args: None)
        with TestClient(create_app(store, token=TOKEN)) as c:
            shown = [c.get(f"/s/{sid}/model/{seq}?fragment=1&token={TOKEN}").text
                     for seq in seqs]
        store.close()
        return shown

    kept = panes(True)
    assert calls[:2] == [(count - 41, None), (count - 1, count - 41)]  # a page before, then on
    assert (count - 30, count - 41) in calls and (count - 1, count - 1) in calls
    calls.clear()
    fresh = panes(False)
    assert kept == fresh and all("Request as of" in pane for pane in kept)


def test_a_long_model_view_shows_its_last_messages_first_and_folds_the_header_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read back first, the header and count in a part of their own (view.md#the-model-view)."""
    from dsh.view import _app

    url = f"jsonl:{tmp_path / 'j'}"
    with dsh.open(url) as store:
        s = store.session("long", header={"createdAt": 1_767_225_600_000})
        s.append("request/header", {"header": {"config": {"provider": "acme",
                                                          "model": "m-long"}},
                                    "reason": "initial"})
        stores.write_turns(s, 250)
    last = 1500

    def pane(tail_after: int, part: str = "") -> str:
        monkeypatch.setattr(_app, "TAIL_FOLD_EVENTS", tail_after)
        store = ViewStore(url)
        with TestClient(create_app(store, token=TOKEN)) as c:
            text = c.get(f"/s/long/model/{last}?fragment=1{part}&token={TOKEN}").text
        store.close()
        return text

    def items(html: str) -> list[str]:
        return re.findall(r'<li class="msg.*?</li>', html, re.S)

    read_back, folded = pane(100), pane(100_000)
    assert len(items(read_back)) == 200 and items(read_back) == items(folded)
    assert "answer 250" in read_back and "m-long" not in read_back  # the header is seq 0
    src = re.search(r'class="model-header" data-src="([^"]+)"', read_back)
    assert src and "part=header" in src.group(1)
    header = pane(100, "&part=header")
    assert "acme/m-long" in header and "500 messages; the first 300 are not shown" in header
    assert "<li" not in header and "m-long" in folded and "model-header" not in folded


def test_store_search_and_session_search_find_message_text(client: TestClient) -> None:
    hits = client.get("/search?q=TypeScript").text
    assert '<mark>TypeScript</mark>' in hits and "s1-normal" in hits
    inner = client.get("/s/s1-normal/search?q=src/index.ts").text
    assert re.search(r'href="/s/s1-normal\?at=\d+#seq-\d+"', inner)


def test_fork_tree_and_diff_of_two_branches(client: TestClient) -> None:
    tree = client.get("/s/s4-fork-of-s1/tree").text
    assert 'href="/s/s1-normal"' in tree and "cut at #134" in tree
    diff = client.get("/diff?a=s1-normal&b=s4-fork-of-s1").text
    assert '<strong id="common">135</strong>' in diff


def test_a_non_loopback_host_is_refused_without_a_token(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    with pytest.raises(ConfigError) as refused:
        serve(f"sqlite:{tmp_path / 'x.db'}", host="0.0.0.0", open_browser=False)
    assert refused.value.code == "VIEW_TOKEN_REQUIRED"
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "view", "--host", "0.0.0.0",
                           "--no-browser", "--store", f"sqlite:{tmp_path / 'x.db'}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "error[VIEW_TOKEN_REQUIRED]" in proc.stderr


def test_a_port_in_use_is_one_line_naming_it_not_a_bug(tmp_path: Path) -> None:
    # fresh-user walk: a second 'dsh view --port N' said "error[BUG]: unexpected OSError:
    # [Errno 98] Address already in use; this is a bug in dsh"
    dsh.open(f"sqlite:{tmp_path / 'x.db'}").close()
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(ConfigError) as refused:
            serve(f"sqlite:{tmp_path / 'x.db'}", port=port, open_browser=False)
        assert refused.value.code == "VIEW_ADDRESS"
        assert f"127.0.0.1:{port}" in str(refused.value) and "--port" in str(refused.value)
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", "view", "--no-browser",
                               "--port", str(port), "--store", f"sqlite:{tmp_path / 'x.db'}"],
                              capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(f"error[VIEW_ADDRESS]: dsh view cannot listen on "
                                  f"127.0.0.1:{port}: ")
    assert "in use" in proc.stderr and "BUG" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("token", ["my secret phrase", "pässwort-1", 'quote"and\\slash'])
def test_a_token_of_any_characters_keeps_working_through_its_cookie(
        store_root: Path, token: str) -> None:
    # --token is the user's own secret: before, the cookie carried it raw, and a token with a
    # space, a quote or a non-ASCII letter did not parse back, so every link was refused
    store = ViewStore(f"jsonl:{store_root}")
    with TestClient(create_app(store, token=token)) as c:
        first = c.get("/", params={"token": token})
        assert first.status_code == 200
        name, _, value = first.headers["set-cookie"].partition(";")[0].partition("=")
        c.cookies.clear()
        link = c.get("/s/s1-normal", headers={"cookie": f"{name}={value}"})
        assert link.status_code == 200 and "needs its token" not in link.text
        assert token not in first.headers["set-cookie"]  # the secret itself is not the cookie
        forged = c.get("/s/s1-normal", headers={"cookie": f"{name}=x{value}"})
        assert forged.status_code == 403
        c.cookies.clear()  # a wrong token of any characters is refused, never a server error
        for wrong in ("%C3%A9", "%ED%A0%80", "%FF", "", "x" + value):
            assert c.get(f"/?token={wrong}").status_code == 403
    store.close()


def test_import_dsh_loads_no_web_stack() -> None:
    script = ("import sys, dsh, dsh.transcript\n"
              "print(sorted(m for m in ('starlette', 'uvicorn', 'jinja2', 'dsh.view') "
              "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


def test_the_viewer_reads_through_the_public_api_only() -> None:
    """Every dsh import of src/dsh/view is a public module (docs/view.md#scale)."""
    import ast

    from tests.architecture import PUBLIC_MODULES

    view = Path(__file__).resolve().parents[2] / "src" / "dsh" / "view"
    found: set[str] = set()
    for path in view.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    used = {name for name in found if name == "dsh" or name.startswith("dsh.")}
    private = sorted(n for n in used if n not in PUBLIC_MODULES and not n.startswith("dsh.view"))
    assert private == [] and "dsh" in used and "dsh.transcript" in used


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "jsonl"])
def test_a_log_without_a_restore_point_is_paged_by_range(tmp_path: Path, backend: str) -> None:
    from tests.persistence.test_pages import ranged_url, write_without_restore_point

    with ranged_url(backend, tmp_path) as url:
        write_without_restore_point(url, 1000)  # 6,000 events, no restore point
        store = ViewStore(url)
        try:
            opened = store.open_session("big")
            assert opened.paged and opened.restore is None and len(opened.events) == 6000
            with TestClient(create_app(store, token=TOKEN)) as c:
                latest = c.get(f"/s/big?token={TOKEN}").text
                assert "answer 1000" in latest and ">answer 900<" not in latest
                assert "checked against the log's integrity" in latest  # says how far
                first = c.get(f"/s/big?start=0&token={TOKEN}").text
                assert "question 1<" in first and "answer 1000" not in first
                model = c.get(f"/s/big/model/5996?fragment=1&token={TOKEN}").text
                assert "question 1000" in model
        finally:
            store.close()


DAY = 86_400_000
JAN_1 = 1_767_225_600_000  # 2026-01-01 00:00 UTC


def _listed_store(url: str) -> None:
    """Four sessions on four days: models, sources, sizes and turns all different."""
    from dsh.testing._logs import assistant, user

    plan = [("alpha", 0, "gpt-5", "dsh", 1), ("bravo", 3, "claude-opus", "claude-code", 4),
            ("charlie", 6, None, "codex", 2), ("delta", 9, "gpt-5-mini", "dsh", 3)]
    for sid, day, model, source, turns in plan:
        with dsh.open(url, clock=stores.fixed_clock(JAN_1 + day * DAY)) as store:
            s = store.session(sid, header={"createdAt": JAN_1 + day * DAY, "cwd": f"/w/{sid}"})
            if source != "dsh":
                s.append("import/source", {"format": source, "path": f"/x/{sid}",
                                           "sha256": "0" * 64, "size": 1,
                                           "importerVersion": 1}, ignorable=True)
            for turn in range(1, turns + 1):
                s.append("turn/start", {"turn": turn})
                s.append("step/start", {"turn": turn, "step": 1})
                s.append("user/message", user(f"{sid} question {turn} " + "x" * 300 * turns,
                                              f"u{turn}"), surface_op="append")
                if model is not None:  # charlie: no request and no answer, so no model
                    s.append("request/context", {"provider": "p", "model": model})
                    s.append("assistant/message", assistant(turn, 1, f"{sid} answer",
                                                            f"a{turn}"), surface_op="append")
                s.append("step/end", {"turn": turn, "step": 1})
                s.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr><td><a href="/s/([^"]+)">', html)


def test_session_list_columns_filters_and_sorts_come_from_the_listing(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'l.db'}"
    _listed_store(url)
    store = ViewStore(url)
    try:
        with TestClient(create_app(store, token=TOKEN)) as c:
            html = c.get(f"/?token={TOKEN}").text
            for label in ("model", "first activity (UTC)", "size", "last activity (UTC)"):
                assert f">{label}" in html
            assert _ids(html) == ["delta", "charlie", "bravo", "alpha"]  # latest activity first
            row = re.search(r'<tr><td><a href="/s/bravo">.*?</tr>', html)
            assert row is not None
            cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))
            assert cells[2:4] == ["claude-code", "claude-opus"]
            assert cells[5] == "2026-01-04 00:00:00"  # first activity: its first event
            assert re.fullmatch(r"\d+\.\d KB", cells[9])  # the rows' bytes
            charlie = re.search(r'<tr><td><a href="/s/charlie">.*?</tr>', html)
            assert charlie is not None and '<td class="model">-</td>' in charlie.group(0)

            def order(query: str) -> list[str]:
                return _ids(c.get(f"/?{query}").text)

            assert order("sort=turns") == ["bravo", "delta", "charlie", "alpha"]
            assert order("sort=turns&dir=asc") == ["alpha", "charlie", "delta", "bravo"]
            assert order("sort=size") == ["bravo", "delta", "charlie", "alpha"]
            assert order("sort=model") == ["charlie", "bravo", "alpha", "delta"]  # none first
            assert order("sort=source&dir=desc") == ["delta", "alpha", "charlie", "bravo"]
            assert order("sort=first&dir=asc") == ["alpha", "bravo", "charlie", "delta"]
            assert order("sort=id&dir=desc") == ["delta", "charlie", "bravo", "alpha"]
            assert order("source=dsh") == ["delta", "alpha"]
            assert order("source=codex") == ["charlie"]
            assert order("since=2026-01-04&until=2026-01-07") == ["charlie", "bravo"]
            assert order("since=2026-01-08") == ["delta"]
            assert order("until=2026-01-02") == ["alpha"]
            assert order("q=GPT-5") == ["delta", "alpha"]  # the model matches too
            assert order("q=gpt&source=dsh&sort=turns&dir=asc") == ["alpha", "delta"]
            # the header links keep the filters and flip the direction of the sorted column
            sorted_page = c.get("/?source=dsh&sort=turns&dir=desc").text
            assert 'href="/?source=dsh&amp;sort=turns&amp;dir=asc"' in sorted_page
            assert 'aria-sort="descending"' in sorted_page
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_a_model_view_kept_before_an_erasure_is_not_shown_after_it(
        tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A running viewer shows none of an erased session's content (docs/forgetting.md#erasure).

    An erasure keeps every seq (tombstones), so a kept model view's event still matched and
    the pane went on showing the erased system prompt and messages from the fold kept before
    it, for as long as the viewer ran.
    """
    from dsh.rights import erase
    from dsh.view import _data

    monkeypatch.setattr(_data, "_FULL_READ_TTL_S", 0.0)  # its 5 s reuse is not under test

    url = f"{backend}:{tmp_path / ('s.db' if backend == 'sqlite' else 'j')}"
    with dsh.open(url) as store:
        s = store.session("victim", header={"createdAt": 1_767_225_600_000})
        s.append("request/header", {"header": {"config": {"provider": "acme", "model": "m"},
                                               "system": "the code is ZQX-SYSTEM-SECRET"},
                                    "reason": "initial"})
        stores.write_turns(s, 3)
        last = len(s.events) - 1
    view = ViewStore(url)
    with TestClient(create_app(view, token=TOKEN)) as c:
        def pane(seq: int) -> str:
            return c.get(f"/s/victim/model/{seq}?fragment=1&token={TOKEN}").text

        before = [pane(seq) for seq in (last, last - 6, last)]
        assert all("ZQX-SYSTEM-SECRET" in text and "answer 3" in before[0] for text in before)
        with dsh.open(url) as store:
            erase(store, ["victim"])
        after = [pane(seq) for seq in (last, last - 6, last + 1)]
    view.close()
    assert all("Request as of" in text for text in after)
    assert [("ZQX-SYSTEM-SECRET" in text, "answer 3" in text) for text in after] == [
        (False, False)] * 3


def _secret_session(url: str) -> None:
    with dsh.open(url) as store:
        s = store.session("victim", header={"createdAt": 1_767_225_600_000})
        s.append("request/header", {"header": {"config": {"provider": "acme", "model": "m"}},
                                    "reason": "initial"})
        stores.write_turns(s, 2)
        s.append("user/message", stores.user("the code is ZQX-ERASED-SECRET", "u9"),
                 surface_op="append")


FORGET = ["erase", "redact"]


@pytest.mark.parametrize("backend", ["jsonl", "jsonl-zstd", "sqlite"])
@pytest.mark.parametrize("how", FORGET)
def test_a_session_read_in_full_is_not_reused_after_a_rewrite(
        tmp_path: Path, backend: str, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page after an erasure or redaction never shows the content from a read kept before it.

    The full read was reused for 5 s whatever happened to the log, so a page fetched within
    that window still showed the erased text (docs/view.md#the-model-view). The window is
    made an hour here so the reuse is certainly in force.
    """
    from dsh.rights import erase, redact
    from dsh.view import _data

    monkeypatch.setattr(_data, "_FULL_READ_TTL_S", 3600.0)
    url = {"jsonl": f"jsonl:{tmp_path / 'j'}",
           "jsonl-zstd": f"jsonl:{tmp_path / 'z'}?compression=zstd",
           "sqlite": f"sqlite:{tmp_path / 's.db'}"}[backend]
    _secret_session(url)
    view = ViewStore(url)
    with TestClient(create_app(view, token=TOKEN)) as c:
        first = c.get(f"/s/victim?token={TOKEN}").text
        assert "ZQX-ERASED-SECRET" in first and "answer 2" in first
        again = c.get(f"/s/victim?token={TOKEN}").text
        assert "ZQX-ERASED-SECRET" in again
        assert view._full.get("victim") is not None  # read in full, and kept
        with dsh.open(url) as store:
            if how == "erase":
                erase(store, ["victim"])
            else:
                redact(store, "victim", match="ZQX-ERASED-SECRET")
        after = c.get(f"/s/victim?token={TOKEN}").text
    view.close()
    assert "ZQX-ERASED-SECRET" not in after and "[REDACTED]" in after
    assert ("answer 2" in after) is (how == "redact")


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_a_running_dsh_view_shows_no_erased_text_right_after_dsh_erase(
        tmp_path: Path, backend: str) -> None:
    """The same through a ``dsh view`` process and the ``dsh erase`` command.

    Before the fix this failed whenever the erasure and the next page came within the 5 s
    reuse (the page showed the secret).
    """
    import signal
    import urllib.request

    from dsh.rights import erase
    from tests.view.stores import start_view

    url = f"jsonl:{tmp_path / 'j'}" if backend == "jsonl" else f"sqlite:{tmp_path / 's.db'}"
    _secret_session(url)
    server, base, token = start_view(url)
    assert server.stdout is not None
    try:

        def page() -> str:
            with urllib.request.urlopen(f"{base}/s/victim?token={token}", timeout=60) as got:
                return str(got.read().decode())

        assert "ZQX-ERASED-SECRET" in page()
        with dsh.open(url) as store:  # in this process: well within the 5 s it kept reads
            erase(store, ["victim"])
        after = page()
        assert "ZQX-ERASED-SECRET" not in after and "[REDACTED]" in after
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
        server.stdout.close()


def test_kept_model_views_are_checked_against_one_look_at_the_log(tmp_path: Path) -> None:
    # docs/view.md#the-model-view: a kept view holds while no redaction/applied came after
    # the log it was folded from; the views kept of a session are checked against one look at
    # the events past the shortest of their logs (it was one look per kept view)
    from types import SimpleNamespace
    from typing import Any

    from dsh.session import REDACTION_APPLIED
    from dsh.testing import make

    class Counted(list[Any]):
        slices = 0

        def __getitem__(self, index: Any) -> Any:
            if isinstance(index, slice):
                Counted.slices += 1
            return super().__getitem__(index)

    events = Counted(make("todo/write", seq, {"todos": []}) for seq in range(10))
    events[5] = make(REDACTION_APPLIED, 5, {"items": []})
    store = ViewStore(f"jsonl:{tmp_path}")
    views = {seq: SimpleNamespace(seq=seq) for seq in (2, 3, 7)}
    for seq, length in ((2, 4), (3, 5), (7, 8)):
        store.keep_fold("s", views[seq], events[:length])  # type: ignore[arg-type]  # only .seq
    Counted.slices = 0
    assert store.folded("s", events, 9) is views[7]  # kept after the rewrite: it holds
    assert store.folded("s", events, 4) is None  # kept before it: dropped, both at once
    assert Counted.slices == 2  # one look a call
    assert store.folded("s", events, 4) is None and Counted.slices == 2  # none left to check
    assert store.folded("s", events[:5], 9) is None  # a shorter log: not the same log
    store.close()
