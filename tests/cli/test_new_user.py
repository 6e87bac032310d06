"""What a new user hit on a fresh clone, each as a real ``dsh`` process on a real store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.agent.providers.servers import ScriptedServer, Stream, openai_reply

DSH = [sys.executable, "-m", "dsh.cli"]
INTERRUPTED = "22222222-2222-4333-8444-555555555555"  # a bundled example with an open turn
COMPACTED = "77777777-2222-4333-8444-555555555555"


def dsh(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
        stdin: str | None = None, argv: list[str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """``dsh args`` (or ``argv``, another command) with HOME ``tmp_path`` and DSH_HOME in it."""
    base = {k: v for k, v in os.environ.items()
            if not k.endswith("_API_KEY") and not k.startswith("DSH_")}
    base.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    return subprocess.run(argv or [*DSH, *args], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, input=stdin)


def local(server: ScriptedServer) -> list[str]:
    return ["--provider", "openai-compatible", "--model", "local-model", "--base-url",
            server.base_url]


def events(tmp_path: Path, session: str) -> list[dict[str, Any]]:
    out = dsh(tmp_path, "events", session)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def ids(tmp_path: Path) -> list[str]:
    out = dsh(tmp_path, "ls", "--json")
    assert out.returncode == 0, out.stderr
    return sorted(row["id"] for row in json.loads(out.stdout))


# -- 1. a write names its session exactly ------------------------------------------------------


def test_run_refuses_a_prefix_of_another_session_and_writes_nothing(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    before = events(tmp_path, INTERRUPTED)
    with ScriptedServer([Stream(openai_reply("hello"))]) as server:
        result = dsh(tmp_path, "run", "hi", "--session", "2222", *local(server))
        assert server.requests == []
    assert result.returncode == 1
    assert "error[SESSION_ID_PREFIX]" in result.stderr
    assert INTERRUPTED in result.stderr  # names the session it did not write to
    assert events(tmp_path, INTERRUPTED) == before  # no turn, no committed repair
    assert "2222" not in ids(tmp_path)


def test_a_new_session_named_exactly_and_a_write_by_prefix_says_which(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    with ScriptedServer([Stream(openai_reply("hello"))]) as server:
        result = dsh(tmp_path, "run", "hi", "--session", "fresh", *local(server))
    assert result.returncode == 0, result.stderr
    assert "fresh" in ids(tmp_path)
    resumed = dsh(tmp_path, "resume", "2222")
    assert resumed.returncode == 0, resumed.stderr
    assert f"'2222' is a prefix of session {INTERRUPTED}" in resumed.stderr


# -- 2. importing again after resume, compact, chat adds no session ----------------------------


def test_reimport_after_resume_compact_and_run_is_skipped(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    first = ids(tmp_path)
    assert dsh(tmp_path, "resume", INTERRUPTED).returncode == 0
    assert dsh(tmp_path, "compact", COMPACTED).returncode == 0
    with ScriptedServer([Stream(openai_reply("Noted."))]) as server:
        ran = dsh(tmp_path, "run", "thanks", "--session",
                  "33333333-2222-4333-8444-555555555555", *local(server))
    assert ran.returncode == 0, ran.stderr
    again = dsh(tmp_path, "import", "--examples", "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["imported"] == [] and report["superseded"] == []
    assert len(report["skipped"]) == 12
    assert ids(tmp_path) == first


def test_reimport_of_a_grown_source_continued_in_dsh_is_a_new_session(tmp_path: Path) -> None:
    # The part imported before is unchanged, but both dsh (the repair) and the source went on
    # after it: the two continuations differ, so the grown source is a session of its own.
    source = tmp_path / "s.jsonl"
    example = Path(__file__).resolve().parents[2] / "src" / "dsh" / "examples" / "transcripts"
    lines = (example / "claude-code" / "interrupted.jsonl").read_text().splitlines(True)
    source.write_text("".join(lines))
    assert dsh(tmp_path, "import", str(source)).returncode == 0
    assert dsh(tmp_path, "resume", INTERRUPTED).returncode == 0
    assert dsh(tmp_path, "import", str(source), "--json").returncode == 0
    assert ids(tmp_path) == [INTERRUPTED]
    record = json.loads(lines[-1])
    grown = {**record, "uuid": "added-1", "parentUuid": record["uuid"], "type": "user",
             "message": {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "toolu_12", "content": "build/"}]}}
    source.write_text("".join(lines) + json.dumps(grown) + "\n")
    again = dsh(tmp_path, "import", str(source), "--json")
    assert again.returncode == 0, again.stderr
    assert len(json.loads(again.stdout)["superseded"]) == 1


# -- 3. a live transcript whose last line is being written ------------------------------------


def test_a_live_claude_code_log_imports_its_complete_lines_and_says_the_last_is_cut(
        tmp_path: Path) -> None:
    example = (Path(__file__).resolve().parents[2] / "src" / "dsh" / "examples" / "transcripts"
               / "claude-code" / "interrupted.jsonl")
    lines = example.read_text().splitlines(True)
    whole = tmp_path / "whole" / "s.jsonl"
    whole.parent.mkdir()
    whole.write_text("".join(lines[:-1]))
    live = tmp_path / "live" / "s.jsonl"
    live.parent.mkdir()
    live.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # half a record
    result = dsh(tmp_path, "import", str(live))
    assert result.returncode == 0, result.stderr
    assert f"its last line ({len(lines)}) is cut off" in result.stderr
    assert "1 imported" in result.stdout
    cut = events(tmp_path, INTERRUPTED)
    as_json = dsh(tmp_path, "import", str(live), "--json", "--store", str(tmp_path / "b.db"))
    assert json.loads(as_json.stdout)["cut"] == [{"path": str(live), "line": len(lines)}]
    assert dsh(tmp_path, "import", str(whole), "--store", str(tmp_path / "c.db")).returncode == 0
    complete = dsh(tmp_path, "events", INTERRUPTED, "--store", str(tmp_path / "c.db"))
    assert [e["type"] for e in cut] == [json.loads(x)["type"]
                                        for x in complete.stdout.splitlines()]


# -- 10. usage errors exit 2; the dsh home is private -----------------------------------------


def test_an_unknown_provider_is_a_usage_error(tmp_path: Path) -> None:
    for command in (["run", "hi"], ["chat"]):
        result = dsh(tmp_path, *command, "--provider", "foo")
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error[USAGE]: ")
        assert "unknown provider 'foo'; choose one of deepseek" in result.stderr
    assert not (tmp_path / "home").exists()  # nothing created for a usage error


def test_a_bad_number_is_dshs_usage_error_naming_the_option_and_what_it_takes(
        tmp_path: Path) -> None:
    # typer's validator said "Input should be a valid integer, unable to parse string as an
    # integer": a new user's "--last ten" deserves the option, its argument and its range.
    cases = [(["show", INTERRUPTED, "--last", "ten"],
              "'--last' takes a whole number N of at least 1, not 'ten'; run 'dsh show --help'"),
             (["show", INTERRUPTED, "--last", "0"],
              "'--last' takes a whole number N of at least 1, not '0'; "),
             (["show", INTERRUPTED, "--last", "2.5"],
              "'--last' takes a whole number N of at least 1, not '2.5'; "),
             (["retention", "--trash-after", "soon"],
              "'--trash-after' takes a whole number DAYS of at least 0, not 'soon'; "),
             (["gc", "--wait", "long"],
              "'--wait' takes a number SECONDS of at least 0, not 'long'; ")]
    for args, said in cases:
        result = dsh(tmp_path, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith(f"error[USAGE]: {said}"), result.stderr
        assert "Input should" not in result.stderr
    assert not (tmp_path / "home").exists()


def test_redact_secrets_without_detect_secrets_says_so_and_names_the_extra(
        tmp_path: Path) -> None:
    # Without the forget extra a new user saw only "nothing to redact", as if the session
    # were clean; dsh's own patterns still run (docs/forgetting.md#finding-secrets).
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    blocked = tmp_path / "blocked"
    (blocked / "detect_secrets").mkdir(parents=True)
    (blocked / "detect_secrets" / "__init__.py").write_text(
        "raise ImportError('not installed')\n", encoding="utf-8")
    env = {"PYTHONPATH": os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")])}
    for extra in ([], ["--json"]):
        result = dsh(tmp_path, "redact", INTERRUPTED, "--secrets", "--dry-run", *extra, env=env)
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith(
            "warning: the secrets detector detect-secrets is not installed: only dsh's own "
            "patterns looked for secrets; install it with the 'forget' extra: "), result.stderr
        assert "[forget]" in result.stderr
    found = dsh(tmp_path, "redact", INTERRUPTED, "--secrets", "--dry-run")
    assert found.returncode == 0 and "warning" not in found.stderr, found.stderr


def test_search_finds_what_a_compaction_summary_shadows_never_the_summary(
        tmp_path: Path) -> None:
    # docs/stores.md#search: only messages appended as they are are indexed; a new user
    # searched for words of a dsh compaction's summary and found nothing.
    for store in ([], ["--store", str(tmp_path / "jsonl") + "/"]):
        assert dsh(tmp_path, "import", "--examples", *store).returncode == 0
        summary = dsh(tmp_path, "search", "continued from a previous conversation", "--json",
                      *store)
        assert summary.returncode == 0, summary.stderr
        assert json.loads(summary.stdout)["hits"] == []
        shadowed = json.loads(dsh(tmp_path, "search", "8080", "--json", *store).stdout)
        assert {(h["session"][:8], h["seq"]) for h in shadowed["hits"]} >= {
            ("33333333", 9), ("33333333", 13)}  # seqs 4-13 are shadowed by the summary, #20


def test_the_default_home_is_created_private(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    env["HOME"] = str(tmp_path)
    result = subprocess.run([*DSH, "import", "--examples"], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".dsh").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / ".dsh" / "sessions.db").stat().st_mode & 0o777 == 0o600


# -- 7. fork ids keep short prefixes unique ----------------------------------------------------


def test_default_fork_ids_keep_every_short_prefix_unique(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    children = []
    for _ in range(3):
        forked = dsh(tmp_path, "fork", INTERRUPTED[:8], "--json")
        assert forked.returncode == 0, forked.stderr
        children.append(json.loads(forked.stdout)["id"])
    shown = dsh(tmp_path, "show", INTERRUPTED[:8])
    assert shown.returncode == 0, shown.stderr  # the parent's short prefix is still its own
    stored = ids(tmp_path)
    for child in children:
        assert not child.startswith(INTERRUPTED)
        assert [sid for sid in stored if sid.startswith(child[:8])] == [child]
        assert dsh(tmp_path, "show", child[:8]).returncode == 0
    rows = json.loads(dsh(tmp_path, "ls", "--json").stdout)
    assert {r["id"]: r["parentSession"] for r in rows if r["id"] in children} == dict.fromkeys(
        children, INTERRUPTED)


# -- 6. nothing written by a chat opened and left ----------------------------------------------


def _chat(tmp_path: Path, server: ScriptedServer, *args: str) -> Any:
    import pexpect

    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith("DSH_")}
    env.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "TERM": "dumb",
                "COLUMNS": "100"})
    return pexpect.spawn(sys.executable, ["-m", "dsh.cli", "chat", *args, *local(server)],
                         env=env, cwd=str(tmp_path), encoding="utf-8", timeout=90)


def test_a_chat_opened_and_left_writes_nothing(tmp_path: Path) -> None:
    import pexpect

    session = "33333333-2222-4333-8444-555555555555"
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    before = events(tmp_path, session)
    listed = dsh(tmp_path, "ls", "--json").stdout
    with ScriptedServer([]) as server:
        chat = _chat(tmp_path, server, session)
        chat.expect_exact("Read config.toml")  # the history is shown
        chat.expect_exact("you> ")
        chat.sendline("/show")
        chat.expect_exact("you> ")
        chat.sendline("/exit")
        chat.expect_exact(f"nothing written · continue with: dsh chat {session}")
        chat.expect(pexpect.EOF)
        chat.close()
        new = _chat(tmp_path, server)
        new.expect(r"session (\S+) ·")
        minted = new.match.group(1)
        new.expect_exact("you> ")
        new.sendeof()
        new.expect_exact("bye · nothing written")
        new.expect(pexpect.EOF)
        new.close()
        assert server.requests == []
    assert events(tmp_path, session) == before
    assert dsh(tmp_path, "ls", "--json").stdout == listed  # LAST ACTIVITY did not move
    assert minted not in ids(tmp_path)


# -- 8. settings, completion, chat commands, --wait --------------------------------------------


def test_provider_model_and_base_url_come_from_the_environment_or_the_config_file(
        tmp_path: Path) -> None:
    with ScriptedServer([Stream(openai_reply("from env")), Stream(openai_reply("from file")),
                         Stream(openai_reply("flags win"))]) as server:
        env = {"DSH_PROVIDER": "openai-compatible", "DSH_MODEL": "env-model",
               "DSH_BASE_URL": server.base_url}
        ran = dsh(tmp_path, "run", "hi", env=env)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == "from env\n"
        (tmp_path / "home").mkdir(exist_ok=True)
        (tmp_path / "home" / "config.toml").write_text(
            f'provider = "openai-compatible"\nmodel = "file-model"\n'
            f'base_url = "{server.base_url}"\n')
        ran = dsh(tmp_path, "run", "hi")
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == "from file\n"
        ran = dsh(tmp_path, "run", "hi", "--model", "flag-model", env={"DSH_MODEL": "env-model"})
        assert ran.returncode == 0, ran.stderr
        assert [r["model"] for r in server.requests] == ["env-model", "file-model",
                                                        "flag-model"]
    (tmp_path / "home" / "config.toml").write_text('provider = "nope"\n')
    bad = dsh(tmp_path, "run", "hi")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error[CONFIG_INVALID]: unknown provider 'nope' in config.toml")


def test_shell_completion_completes_commands_and_options(tmp_path: Path) -> None:
    # bash loads what 'dsh --show-completion' prints and completes with it, as a user's shell
    # does. dsh finds its shell among its parents: here bash always is one, so the test holds
    # under any parent (run from a process with no shell above it, '--show-completion' said
    # "Shell  not supported")
    assert (Path(sys.executable).parent / "dsh").exists()  # the installed command
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    complete = ('COMP_WORDS=({}); COMP_CWORD={}; _dsh_completion dsh; '
                'printf "%s\\n" "${{COMPREPLY[*]}}"; ')
    script = ('eval "$(dsh --show-completion)"; complete -p dsh; '
              + complete.format("dsh sh", 1) + complete.format("dsh show --fu", 2))
    done = dsh(tmp_path, env={"PATH": path}, argv=["bash", "--norc", "-c", script])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["complete -o default -F _dsh_completion dsh", "show",
                                        "--full"]


def test_run_waits_for_a_session_another_process_writes_and_says_who(tmp_path: Path) -> None:
    from tests.cli.test_busy import _hold, _store

    url = _store(tmp_path)
    holder, release = _hold(tmp_path, url)
    try:
        with ScriptedServer([]) as server:
            ran = dsh(tmp_path, "run", "hi", "--session", "held", "--store", url, "--wait",
                      "0.2", *local(server))
    finally:
        release.write_text("go")
        holder.wait(timeout=60)
    assert ran.returncode == 1
    [line] = [x for x in ran.stderr.splitlines() if x.startswith("error[")]
    assert line.startswith("error[SESSION_BUSY]: session 'held' is being written by another "
                           f"process (pid {holder.pid} on ")
    assert " s ago)" in line and "waited 0.2 s for it" in line and " ms" not in line


def test_chat_help_and_show_full_are_chat_commands(tmp_path: Path) -> None:
    import pexpect

    (tmp_path / "long.txt").write_text("".join(f"line {n}\n" for n in range(30)))
    call = [("call_1", "read_file", '{"path": "long.txt"}')]
    with ScriptedServer([Stream(openai_reply("Reading.", tool_calls=call)),
                         Stream(openai_reply("30 lines."))]) as server:
        chat = _chat(tmp_path, server, "--tools", "read")
        chat.expect_exact("/help")  # the banner names it
        chat.expect_exact("you> ")
        chat.sendline("/help")
        chat.expect_exact("/show [full]")
        chat.expect_exact("/fork [SEQ]")
        chat.expect_exact("you> ")
        chat.sendline("read long.txt")
        chat.expect_exact("30 lines.")
        chat.expect_exact("you> ")
        chat.sendline("/show")
        chat.expect(r"more lines; /show full shows all\)")
        chat.expect_exact("you> ")
        chat.sendline("/show full")
        chat.expect_exact("line 29")
        chat.expect_exact("you> ")
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
        chat.close()
    assert "--full" not in (chat.before or "")


# -- 5. text streamed before a kill is shown, marked cut off ----------------------------------


def test_text_streamed_before_a_kill_shows_in_the_transcript_marked_cut_off(
        tmp_path: Path) -> None:
    import signal
    import time

    from tests.agent.providers.servers import Stall

    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith("DSH_")}
    env.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    with ScriptedServer([Stall(openai_reply("Half an answer, then")[:3])]) as server:
        child = subprocess.Popen([*DSH, "run", "question", "--session", "cut",
                                  *local(server)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        try:
            # the streamed chunk is durable once another process reads it from the store
            while not any(e["type"] == "assistant/chunk"
                          for e in (events(tmp_path, "cut") if ids(tmp_path) else [])):
                assert child.poll() is None, "dsh run ended before streaming"
                time.sleep(0.05)
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate(timeout=60)
    assert dsh(tmp_path, "resume", "cut").returncode == 0
    shown = dsh(tmp_path, "show", "cut")
    assert shown.returncode == 0, shown.stderr
    assert "CUT OFF" in shown.stdout
    [line] = [x for x in shown.stdout.splitlines() if "Half an" in x]
    assert "Half an" in line
    items = json.loads(dsh(tmp_path, "show", "cut", "--json").stdout)["items"]
    [cut] = [i for i in items if i.get("cutOff")]
    assert cut["role"] == "assistant" and cut["blocks"][0]["text"].startswith("Half an")


# -- 6. a failed dsh run leaves no session -------------------------------------------------------


def test_a_run_refused_by_the_server_or_unreachable_creates_no_session(tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class RefusesTheKey(BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            body = json.dumps({"error": {"message": "Incorrect API key provided",
                                         "type": "invalid_request_error",
                                         "code": "invalid_api_key"}}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _refuse

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), RefusesTheKey)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        refused = dsh(tmp_path, "run", "hi", "--provider", "openai-compatible", "--model", "m",
                      "--base-url", f"http://127.0.0.1:{server.server_port}/v1")
    finally:
        server.shutdown()
        server.server_close()
    assert refused.returncode == 1
    assert refused.stderr.startswith("error[AUTHENTICATION]: ")
    assert "no session was created" in refused.stderr
    gone = dsh(tmp_path, "run", "hi", "--provider", "openai-compatible", "--model", "m",
               "--base-url", f"http://127.0.0.1:{server.server_port}/v1", "--session", "named")
    assert gone.returncode == 1
    assert gone.stderr.startswith("error[NETWORK]: ")
    listed = dsh(tmp_path, "ls", "--json")
    assert json.loads(listed.stdout or "[]") == []


# -- 9. the transcript as Markdown or HTML -------------------------------------------------------


def test_export_markdown_and_html_carry_the_transcript_with_session_text_escaped(
        tmp_path: Path) -> None:
    hostile = "<script>alert('x')</script> ``` **bold** \x1b[31m"
    with ScriptedServer([Stream(openai_reply("Fine: <b>done</b> ```"))]) as server:
        ran = dsh(tmp_path, "run", hostile, "--session", "doc", *local(server))
    assert ran.returncode == 0, ran.stderr
    md = dsh(tmp_path, "export", "doc", "--format", "markdown")
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("# Session doc\n")
    assert "## Turn 1" in md.stdout and "**user #" in md.stdout
    assert "\x1b" not in md.stdout and "\\x1b[31m" in md.stdout
    assert "\n````text\n<script>alert('x')</script> ``` **bold**" in md.stdout  # fenced
    assert "\n````text\nFine: <b>done</b> ```\n````\n" in md.stdout
    page = dsh(tmp_path, "export", "doc", "--format", "html", "-o", str(tmp_path / "t.html"))
    assert page.returncode == 0, page.stderr
    text = (tmp_path / "t.html").read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert "<script>" not in text and "&lt;script&gt;alert(&#x27;x&#x27;)" in text
    assert "&lt;b&gt;done&lt;/b&gt;" in text and "<b>" not in text
    assert "\x1b" not in text


def test_a_markdown_export_escapes_the_session_id_in_its_heading(tmp_path: Path) -> None:
    # the id is session text too (an importer takes it from the transcript): before, the
    # heading put it in raw, so a Markdown renderer ran its HTML
    sid = "<img src=x onerror=alert(1)>*_[x](javascript:y)"
    with ScriptedServer([Stream(openai_reply("ok"))]) as server:
        ran = dsh(tmp_path, "run", "hi", "--session", sid, *local(server))
    assert ran.returncode == 0, ran.stderr
    md = dsh(tmp_path, "export", sid, "--format", "markdown")
    assert md.returncode == 0, md.stderr
    head = md.stdout.splitlines()[0]
    assert head == "# Session \\<img src=x onerror=alert(1)\\>\\*\\_\\[x\\](javascript:y)"
    assert not re.search(r"(?<!\\)<", md.stdout)  # no markup outside the fenced blocks


# -- 9. colour on a terminal, none in a pipe ---------------------------------------------------


def test_colour_on_a_terminal_only(tmp_path: Path) -> None:
    import pexpect

    assert dsh(tmp_path, "import", "--examples").returncode == 0
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DSH_") and k not in ("NO_COLOR", "TERM")}
    env.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
                "TERM": "xterm-256color", "COLUMNS": "160"})

    def on_terminal(*args: str) -> str:
        child = pexpect.spawn(sys.executable, ["-m", "dsh.cli", *args], env=env,
                              cwd=str(tmp_path), encoding="utf-8", timeout=90)
        child.expect(pexpect.EOF)
        child.close()
        return child.before or ""

    listed = on_terminal("ls")
    assert "\x1b[1mID" in listed  # the column heads in bold
    shown = on_terminal("show", "22222222")
    assert "\x1b[" in shown and "Delete the build folder" in shown
    failed = on_terminal("show", "nope")
    assert "\x1b[1;31merror[SESSION_NOT_FOUND]\x1b[0m" in failed
    piped = dsh(tmp_path, "ls")
    assert "\x1b" not in piped.stdout
    assert "\x1b" not in dsh(tmp_path, "show", "nope").stderr
    env["NO_COLOR"] = "1"
    assert "\x1b[" not in on_terminal("show", "nope")


# -- the README's commands, followed as written --------------------------------------------------


def test_an_empty_trash_or_archive_is_not_called_an_empty_store(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    trash = dsh(tmp_path, "ls", "--trash")
    assert trash.returncode == 0 and trash.stdout == ""
    assert "the trash is empty" in trash.stderr and "no sessions in the store" not in trash.stderr
    archived = dsh(tmp_path, "ls", "--archived")
    assert archived.returncode == 0 and "no archived sessions" in archived.stderr


def test_a_store_whose_sessions_are_all_in_the_trash_is_not_called_empty(
        tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    every = ids(tmp_path)
    assert dsh(tmp_path, "rm", *every).returncode == 0
    listed = dsh(tmp_path, "ls")
    assert listed.returncode == 0 and listed.stdout == ""
    assert f"no sessions listed: {len(every)} sessions in the trash or archived" in listed.stderr
    assert "no sessions in the store" not in listed.stderr


def test_a_search_leaves_no_wal_or_shm_beside_the_store(tmp_path: Path) -> None:
    # before: each 'dsh search' on an index that was up to date left sessions.db-wal and
    # sessions.db-shm behind (the store attached read-only was the file's last connection, and
    # a read-only connection cannot remove them); no other read did
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    home = tmp_path / "home"
    for words in (["port"], ["port"], ["--rebuild", "port"], ["nothing", "matches"]):
        searched = dsh(tmp_path, "search", *words)
        assert searched.returncode == 0, searched.stderr
        names = sorted(p.name for p in home.iterdir())
        assert names == ["sessions.db", "sessions.db.dsh-locks", "sessions.db.dsh-seals",
                         "sessions.db.dsh-search.db"], (words, names)  # docs/formats.md


def test_a_purged_session_stays_in_the_trash_marked_purged(tmp_path: Path) -> None:
    # docs/forgetting.md: purged, it "stays in the trash, marked purged"; REASON was "-"
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    assert dsh(tmp_path, "rm", INTERRUPTED, "--reason", "old").returncode == 0
    assert dsh(tmp_path, "rm", "--purge", COMPACTED).returncode == 0
    trash = dsh(tmp_path, "ls", "--trash").stdout.splitlines()
    assert trash[0].split()[-1] == "REASON"
    reasons = {line.split()[0]: line.rsplit("  ", 1)[-1].strip() for line in trash[1:]}
    assert reasons == {INTERRUPTED: "old", COMPACTED: "purged"}
    listed = json.loads(dsh(tmp_path, "ls", "--trash", "--json").stdout)
    assert {(r["id"], r["trashReason"], r["purged"]) for r in listed} == {
        (INTERRUPTED, "old", False), (COMPACTED, None, True)}


def test_ls_on_the_folder_of_a_sqlite_store_names_the_store_and_the_file_to_pass(
        tmp_path: Path) -> None:
    # `--store $DSH_HOME` (the folder, not sessions.db) is an empty JSONL store: saying only
    # "no sessions in the store" sent a new user looking for where the sessions went.
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    assert dsh(tmp_path, "search", "port").returncode == 0  # its index is a SQLite sidecar
    home = tmp_path / "home"
    assert (home / "sessions.db.dsh-search.db").is_file()
    listed = dsh(tmp_path, "ls", "--store", str(home))
    assert listed.returncode == 0 and listed.stdout == ""
    assert f"no sessions in the store jsonl://{home}" in listed.stderr
    assert f"this folder holds a SQLite store: --store {home / 'sessions.db'};" in listed.stderr
    empty = tmp_path / "logs"
    empty.mkdir()
    plain = dsh(tmp_path, "ls", "--store", str(empty))
    assert plain.returncode == 0
    assert f"no sessions in the store jsonl://{empty};" in plain.stderr
    assert "SQLite" not in plain.stderr


def test_events_with_a_misspelt_type_says_nothing_matched_and_the_closest_type(
        tmp_path: Path) -> None:
    # `dsh events ID --type user/mesage` printed nothing and exited 0: no way to tell a typo
    # from a session without such events.
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    typo = dsh(tmp_path, "events", COMPACTED, "--type", "user/mesage")
    assert typo.returncode == 0 and typo.stdout == ""
    assert typo.stderr == (f"note: no event of session {COMPACTED} has a type matching "
                           "'user/mesage'; did you mean 'user/message'?\n")
    # nothing close to the name: the note lists the session's types instead
    unknown = dsh(tmp_path, "events", COMPACTED, "--type", "nosuch")
    assert unknown.returncode == 0 and unknown.stdout == ""
    assert unknown.stderr == (f"note: no event of session {COMPACTED} has a type matching "
                              "'nosuch'; its types: assistant/message, "
                              "import/claude-code/envelope, import/source, step/end, "
                              "step/start, tool/call, tool/result, turn/end, turn/start, "
                              "user/message\n")
    late = dsh(tmp_path, "events", COMPACTED, "--type", "user/message", "--from", "9999")
    assert late.returncode == 0 and late.stdout == ""
    assert late.stderr == (f"note: no event of session {COMPACTED} from seq 9999 has a type "
                           "matching 'user/message'\n")
    found = dsh(tmp_path, "events", COMPACTED, "--type", "turn/*")
    assert found.returncode == 0 and found.stderr == ""
    assert len(found.stdout.splitlines()) == 8  # 4 turns, each a start and an end


def test_import_takes_format_atif_as_the_readme_lists_it(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    out = tmp_path / "say-hi.atif.json"
    assert dsh(tmp_path, "export", "6666", "--format", "atif", "-o", str(out)).returncode == 0
    again = dsh(tmp_path, "import", str(out), "--format", "atif", "--store",
                str(tmp_path / "other.db"))
    assert again.returncode == 0, again.stderr
    assert "(atif)" in again.stdout


def test_exported_documents_count_one_turn_in_the_singular(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    md = dsh(tmp_path, "export", "6666", "--format", "markdown")
    assert md.returncode == 0, md.stderr
    assert "7 events · 1 turn · source dsh" in md.stdout


def test_a_receipt_that_cannot_be_written_is_refused_before_anything_is_erased(
        tmp_path: Path) -> None:
    # before: the erasure (or purge, redaction) was committed, then writing the receipt failed
    # as error[BUG] FileNotFoundError, and the salts that open its commitments were lost
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    before = events(tmp_path, INTERRUPTED)
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    for where in ("no-such-folder/r.json", "a-folder", "link.json"):
        for args in (["erase", "2222"], ["rm", "--purge", "2222"],
                     ["redact", "2222", "--seq", "4"], ["gc", "--apply"]):
            refused = dsh(tmp_path, *args, "--receipt", str(tmp_path / where))
            assert refused.returncode == 2, (args, refused.stderr)
            assert refused.stderr.startswith("error[USAGE]: Invalid value for '--receipt': ")
            assert "nothing was changed" in refused.stderr and "BUG" not in refused.stderr
    assert events(tmp_path, INTERRUPTED) == before
    assert not (tmp_path / "elsewhere.json").exists()
    log = dsh(tmp_path, "gc", "--log")
    assert "store/erased" not in log.stdout
    done = dsh(tmp_path, "erase", "2222", "--receipt", str(tmp_path / "a-folder" / "r.json"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a-folder" / "r.json").stat().st_mode & 0o777 == 0o600


def test_an_existing_receipt_is_kept_unless_force_is_given(tmp_path: Path) -> None:
    # before: '--receipt FILE' truncated an existing file, e.g. an earlier erasure's receipt,
    # whose salts (the only copy) were then lost
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    before = events(tmp_path, INTERRUPTED)
    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"kind": "dsh-erasure"}\n')
    for args in (["erase", "2222"], ["rm", "--purge", "2222"],
                 ["redact", "2222", "--seq", "4"], ["gc", "--apply"]):
        refused = dsh(tmp_path, *args, "--receipt", str(earlier))
        assert refused.returncode == 2, (args, refused.stderr)
        assert refused.stderr.startswith("error[USAGE]: Invalid value for '--receipt': ")
        assert "already exists" in refused.stderr and "--force" in refused.stderr
        assert "nothing was changed" in refused.stderr
    assert earlier.read_text() == '{"kind": "dsh-erasure"}\n'
    assert events(tmp_path, INTERRUPTED) == before
    done = dsh(tmp_path, "erase", "2222", "--receipt", str(earlier), "--force")
    assert done.returncode == 0, done.stderr
    assert json.loads(earlier.read_text())["subjects"] == [INTERRUPTED]
    assert earlier.stat().st_mode & 0o777 == 0o600


def test_erase_with_nothing_selected_says_what_to_give(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    none = dsh(tmp_path, "erase", "--receipt", str(tmp_path / "r.json"))
    assert none.returncode == 1 and "error[NOTHING_SELECTED]" in none.stderr
    assert "{}" not in none.stderr and "--where KEY=VALUE" in none.stderr
    nowhere = dsh(tmp_path, "erase", "--where", "cwd=/nowhere", "--receipt",
                  str(tmp_path / "r.json"))
    assert "none matches --where cwd=/nowhere" in nowhere.stderr


def test_erase_takes_a_prefix_and_names_the_session_it_matched(tmp_path: Path) -> None:
    # every command takes a unique prefix (docs/cli.md#stores-and-ids); erase said not stored
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    receipt = tmp_path / "r.json"
    out = dsh(tmp_path, "erase", "6666", "--receipt", str(receipt))
    assert out.returncode == 0, out.stderr
    [full] = [sid for sid in ids(tmp_path) if sid.startswith("6666")]
    assert f"note: '6666' is a prefix of session {full}" in out.stderr
    assert json.loads(receipt.read_text())["subjects"] == [full]


def test_view_opens_the_session_a_prefix_names(tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    missing = dsh(tmp_path, "view", "nosuch", "--no-browser")
    assert missing.returncode == 1 and "error[SESSION_NOT_FOUND]" in missing.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    env.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    server = subprocess.Popen([*DSH, "view", "6666", "--no-browser"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
    finally:
        server.terminate()
        server.communicate(timeout=30)  # closes both pipes
    assert "/s/66666666-2222-4333-8444-555555555555?token=" in url


def test_retention_says_one_day_in_the_singular(tmp_path: Path) -> None:
    assert dsh(tmp_path, "init").returncode == 0
    set_ = dsh(tmp_path, "retention", "--archive-after", "1", "--trash-after", "30")
    assert set_.returncode == 0, set_.stderr
    assert "store: archive after 1 day, trash after 30 days" in set_.stdout


def test_retention_notes_a_scope_no_session_matches(tmp_path: Path) -> None:
    # "--where source=codex" (no header has "source") was taken silently; gc then applied
    # the store-wide policy to the codex session the user meant to keep
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    typo = dsh(tmp_path, "retention", "--where", "source=codex", "--keep")
    assert typo.returncode == 0, typo.stderr
    assert "note: no stored session matches source=codex" in typo.stderr
    real = dsh(tmp_path, "retention", "--where", f"id={ids(tmp_path)[0]}", "--keep")
    assert real.returncode == 0 and "note:" not in real.stderr, real.stderr


def test_verify_of_a_receipt_that_cannot_be_read_says_why_in_words(tmp_path: Path) -> None:
    # fresh-user walk: a mistyped receipt path printed Python's "[Errno 2] No such file or
    # directory: '...'" after the path
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    missing = dsh(tmp_path, "verify", "--receipt", str(tmp_path / "typo.json"))
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.startswith(
        f"error[USAGE]: Invalid value for '--receipt': cannot read receipt "
        f"{tmp_path / 'typo.json'}: No such file or directory; pass the file 'dsh erase "
        "--receipt FILE' wrote")
    assert "Errno" not in missing.stderr
    (tmp_path / "notes.json").write_text("shopping list\n", encoding="utf-8")
    garbled = dsh(tmp_path, "verify", "--receipt", str(tmp_path / "notes.json"))
    assert garbled.returncode == 2
    assert f"{tmp_path / 'notes.json'} is not a receipt (not JSON: " in garbled.stderr
    (tmp_path / "photo.json").write_bytes(b"\xff\xd8\xff\xe0 not text")
    binary = dsh(tmp_path, "verify", "--receipt", str(tmp_path / "photo.json"))
    assert binary.returncode == 2, binary.stderr  # e035a85 let UnicodeDecodeError out: BUG
    assert f"{tmp_path / 'photo.json'} is not a receipt (not JSON: " in binary.stderr
