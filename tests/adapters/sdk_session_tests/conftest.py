"""The vendored SDK session tests (see tools/vendor/sdk_session_tests.py) and what they skip.

Their ``@pytest.mark.asyncio`` tests run through pytest-asyncio. A test is skipped here only
when it checks SQLiteSession's own machinery rather than a session's observable behaviour:
its sqlite3 connections, tables and locks, which DshSession does not have. Each is named with
the reason; everything else in the vendored files runs unchanged against DshSession.
"""

from __future__ import annotations

import pytest

_SQLITE_INTERNALS = ("reads SQLiteSession's private sqlite3 state (_connections, its tables, "
                     "its file lock); DshSession stores through dsh's own SQLite backend")
NOT_APPLICABLE: dict[str, str] = {
    "test_await_mutation_cancellation_hides_later_failure_without_loop_error":
        "tests agents.memory.sqlite_session._await_mutation, a SQLiteSession helper",
    "test_sqlite_session_close_closes_worker_thread_connections": _SQLITE_INTERNALS,
    "test_sqlite_session_reaps_connections_from_exited_worker_threads": _SQLITE_INTERNALS,
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation":
        _SQLITE_INTERNALS,
    "test_sqlite_session_keeps_connections_of_live_worker_threads": _SQLITE_INTERNALS,
    "test_sqlite_session_pop_item_skips_corrupt_most_recent": _SQLITE_INTERNALS,
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows":
        _SQLITE_INTERNALS,
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _SQLITE_INTERNALS,
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows":
        _SQLITE_INTERNALS,
    "test_sqlite_session_file_lock_is_shared_across_instances": _SQLITE_INTERNALS,
    "test_sqlite_session_failed_add_items_releases_write_lock": _SQLITE_INTERNALS,
    "test_sqlite_session_failed_clear_session_rolls_back": _SQLITE_INTERNALS,
    "test_sqlite_session_failed_pop_item_releases_write_lock": _SQLITE_INTERNALS,
    "test_sqlite_session_rollback_failure_evicts_connection": _SQLITE_INTERNALS,
    "test_sqlite_session_close_retries_quarantined_connection": _SQLITE_INTERNALS,
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome":
        _SQLITE_INTERNALS,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "sdk_session_tests" not in str(item.path):
            continue
        name = getattr(item, "originalname", item.name)
        if name in NOT_APPLICABLE:
            item.add_marker(pytest.mark.skip(reason=f"SQLiteSession-specific: "
                                                    f"{NOT_APPLICABLE[name]}"))
