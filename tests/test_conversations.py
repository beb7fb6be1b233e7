"""The SQLite conversation store: rows written as they happen, listed, loaded, robust to bad files."""

from __future__ import annotations

import sqlite3

import pytest

from localspec.store.conversations import TITLE_CHARS, ConversationStore, default_path, make_title
from localspec.core.errors import LocalspecError


def test_lives_under_the_user_dir(isolated_home):
    assert default_path() == isolated_home / "conversations.db"
    with ConversationStore() as store:
        store.create(model="m")
    assert (isolated_home / "conversations.db").is_file()


def test_wal_mode_and_rows_visible_to_another_connection_at_once(tmp_path):
    path = tmp_path / "c.db"
    store = ConversationStore(path)
    cid = store.create(model="smollm2-135m", system="be brief")
    store.add_message(cid, "user", "Hello there")
    reply = store.add_message(cid, "assistant", "", finish_reason=None)
    store.update_message(reply, "Hi, how")
    # a second connection (another process after a crash) sees every write without a close
    other = sqlite3.connect(str(path))
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rows = other.execute("SELECT role, content, finish_reason FROM messages ORDER BY id").fetchall()
    assert rows == [("user", "Hello there", None), ("assistant", "Hi, how", None)]
    other.close()
    store.close()


def test_round_trip_title_list_and_interrupted_reply(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    a = store.create(model="m1", system="sys")
    store.add_message(a, "user", "  first   question\nwith lines ")
    r = store.add_message(a, "assistant", "", finish_reason=None)
    store.update_message(r, "an answer", finish_reason="stop", meta={"stats": {"n_tokens": 3}})
    store.add_message(a, "user", "second")
    store.add_message(a, "assistant", "partial", finish_reason=None)   # the app died here
    b = store.create(model="m2")
    store.close()

    store = ConversationStore(tmp_path / "c.db")
    listed = store.list()
    assert [c.id for c in listed] == [b, a]          # newest first
    assert listed[1].title == "first question with lines"
    assert listed[1].n_messages == 4 and listed[0].n_messages == 0
    conv = store.load(a)
    assert conv.system == "sys" and conv.model == "m1"
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    assert conv.messages[1].meta == {"stats": {"n_tokens": 3}}
    assert not conv.messages[1].interrupted
    assert conv.messages[3].interrupted and conv.messages[3].content == "partial"
    assert store.latest_id() == b
    store.set_system(a, "new system")
    assert store.load(a).system == "new system"
    assert store.latest_id() == a                     # editing touches the conversation


def test_delete_cascades_and_unknown_ids(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    cid = store.create()
    store.add_message(cid, "user", "x")
    store.delete(cid)
    assert store.list() == []
    assert not store.exists(cid)
    with pytest.raises(LocalspecError, match="no conversation with id"):
        store.load(cid)
    with pytest.raises(LocalspecError, match="unknown message role"):
        store.add_message(store.create(), "robot", "x")


def test_title_is_shortened():
    title = make_title("word " * 40)
    assert len(title) <= TITLE_CHARS and title.endswith("…")


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    bad = tmp_path / "c.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LocalspecError, match="cannot open the conversation database"):
        ConversationStore(bad)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "c.db"
    db = sqlite3.connect(str(path))
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(LocalspecError, match="newer localspec"):
        ConversationStore(path)


def test_listing_while_another_chat_holds_a_write_transaction(isolated_home):
    """`chat --list` opened the store for writing (schema, pragmas) and failed with "database is
    locked" after ~5 s while another chat wrote; read-only it neither waits nor writes (issue 29)."""
    import subprocess
    import sys
    import time

    with ConversationStore() as store:
        cid = store.create(model="m")
        store.add_message(cid, "user", "hello there")
    writer = sqlite3.connect(str(default_path()), isolation_level=None, timeout=0.1)
    writer.execute("BEGIN IMMEDIATE")       # another chat, in the middle of writing a reply
    writer.execute("UPDATE conversations SET title='being written' WHERE id=?", (cid,))
    try:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "localspec", "chat", "--list"], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "hello there" in proc.stdout and "being written" not in proc.stdout   # the committed state
        assert time.monotonic() - t0 < 4.5, "it waited on the writer"
        with ConversationStore(read_only=True) as reader:
            assert [c.title for c in reader.list()] == ["hello there"]
            with pytest.raises(LocalspecError, match="cannot write"):
                reader.create(model="x")
    finally:
        writer.execute("COMMIT")
        writer.close()


def test_read_only_store_of_nothing_saved_is_empty_and_creates_no_file(isolated_home):
    with ConversationStore(read_only=True) as store:
        assert store.list() == []
    assert not default_path().exists()
