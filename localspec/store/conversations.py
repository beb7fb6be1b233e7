"""Chat conversations kept in SQLite, written as they happen.

One database, ``<user dir>/conversations.db`` (``$LOCALSPEC_HOME`` moves it), in WAL mode. Every
message is one row, committed when it is written: the user's message when it is sent, the
assistant's reply when it starts (empty, ``finish_reason`` NULL) and then again as it streams and
when it ends. A reply whose ``finish_reason`` is still NULL when the conversation is loaded was
interrupted (the app was killed): it is shown as such and kept.

The store is stdlib ``sqlite3`` only, so the TUI and the CLI can use it without loading a model.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import LocalspecError
from ..core.paths import user_dir

DB_NAME = "conversations.db"
SCHEMA_VERSION = 1
ROLES = ("user", "assistant")
TITLE_CHARS = 60

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    title    TEXT NOT NULL DEFAULT '',
    model    TEXT NOT NULL DEFAULT '',
    system   TEXT NOT NULL DEFAULT '',
    created  REAL NOT NULL,
    updated  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id  INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role             TEXT NOT NULL,
    content          TEXT NOT NULL,
    created          REAL NOT NULL,
    finish_reason    TEXT,
    meta             TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


def default_path() -> Path:
    return user_dir() / DB_NAME


@dataclass
class StoredMessage:
    id: int
    role: str
    content: str
    created: float
    finish_reason: str | None = None     # assistant replies: stop, length, context, cancelled, error
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        """An assistant reply that never finished (the app was killed while it streamed)."""
        return self.role == "assistant" and self.finish_reason is None


@dataclass
class ConversationSummary:
    id: int
    title: str
    model: str
    created: float
    updated: float
    n_messages: int


@dataclass
class Conversation:
    id: int
    title: str
    model: str
    system: str
    created: float
    updated: float
    messages: list[StoredMessage] = field(default_factory=list)


def make_title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class ConversationStore:
    """The conversation database. Safe to call from several threads (one connection, one lock)."""

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False) -> None:
        """``read_only``: for listing and reading only; it writes nothing, not even the schema, so
        it never waits on a chat that is writing (a missing database reads as empty)."""
        self.path = Path(path) if path is not None else default_path()
        self._lock = threading.Lock()
        if read_only:
            self._db = self._open_read_only()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=5.0,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise LocalspecError(f"{self.path} was written by a newer localspec (schema {version})")
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            raise LocalspecError(f"cannot open the conversation database {self.path}: {exc}") from None

    def _open_read_only(self) -> sqlite3.Connection:
        try:
            if not self.path.exists():   # nothing saved yet: an empty database in memory
                db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                db.executescript(_SCHEMA)
                return db
            db = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                 timeout=5.0, isolation_level=None)
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise LocalspecError(f"cannot open the conversation database {self.path}: {exc}") from None
        if version > SCHEMA_VERSION:
            raise LocalspecError(f"{self.path} was written by a newer localspec (schema {version})")
        return db

    # -- helpers ---------------------------------------------------------------------------------
    def _write(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        with self._lock:
            try:
                return self._db.execute(sql, args)
            except sqlite3.Error as exc:
                raise LocalspecError(f"cannot write the conversation database: {exc}") from None

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise LocalspecError(f"cannot read the conversation database: {exc}") from None

    def _touch(self, conversation_id: int, now: float) -> None:
        self._write("UPDATE conversations SET updated=? WHERE id=?", (now, conversation_id))

    # -- conversations ---------------------------------------------------------------------------
    def create(self, *, model: str = "", system: str = "", title: str = "") -> int:
        now = time.time()
        cur = self._write(
            "INSERT INTO conversations (title, model, system, created, updated) VALUES (?, ?, ?, ?, ?)",
            (title, model, system or "", now, now))
        return int(cur.lastrowid)

    def exists(self, conversation_id: int) -> bool:
        return bool(self._read("SELECT 1 FROM conversations WHERE id=?", (conversation_id,)))

    def set_system(self, conversation_id: int, system: str) -> None:
        self._write("UPDATE conversations SET system=?, updated=? WHERE id=?",
                    (system or "", time.time(), conversation_id))

    def delete(self, conversation_id: int) -> None:
        self._write("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def list(self, limit: int = 100) -> list[ConversationSummary]:
        rows = self._read(
            "SELECT c.id, c.title, c.model, c.created, c.updated, COUNT(m.id) FROM conversations c "
            "LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id "
            "ORDER BY c.updated DESC, c.id DESC LIMIT ?", (limit,))
        return [ConversationSummary(int(r[0]), r[1], r[2], r[3], r[4], int(r[5])) for r in rows]

    def latest_id(self) -> int | None:
        rows = self._read("SELECT id FROM conversations ORDER BY updated DESC, id DESC LIMIT 1")
        return int(rows[0][0]) if rows else None

    def load(self, conversation_id: int) -> Conversation:
        rows = self._read("SELECT id, title, model, system, created, updated FROM conversations WHERE id=?",
                          (conversation_id,))
        if not rows:
            raise LocalspecError(f"no conversation with id {conversation_id} (localspec chat --list shows them)")
        r = rows[0]
        conv = Conversation(int(r[0]), r[1], r[2], r[3], r[4], r[5])
        for m in self._read("SELECT id, role, content, created, finish_reason, meta FROM messages "
                            "WHERE conversation_id=? ORDER BY id", (conversation_id,)):
            try:
                meta = json.loads(m[5]) if m[5] else {}
            except ValueError:
                meta = {}
            conv.messages.append(StoredMessage(int(m[0]), m[1], m[2], m[3], m[4], meta))
        return conv

    # -- messages --------------------------------------------------------------------------------
    def add_message(self, conversation_id: int, role: str, content: str, *,
                    finish_reason: str | None = None, meta: dict | None = None) -> int:
        if role not in ROLES:
            raise LocalspecError(f"unknown message role '{role}'")
        now = time.time()
        cur = self._write(
            "INSERT INTO messages (conversation_id, role, content, created, finish_reason, meta) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (conversation_id, role, content, now, finish_reason, json.dumps(meta or {})))
        if role == "user":
            # The first user message names the conversation.
            self._write("UPDATE conversations SET title=? WHERE id=? AND title=''",
                        (make_title(content), conversation_id))
        self._touch(conversation_id, now)
        return int(cur.lastrowid)

    def update_message(self, message_id: int, content: str, *, finish_reason: str | None = None,
                       meta: dict | None = None) -> None:
        """Rewrite a (streaming) reply: called as it grows and once more when it ends."""
        if meta is None:
            self._write("UPDATE messages SET content=?, finish_reason=? WHERE id=?",
                        (content, finish_reason, message_id))
        else:
            self._write("UPDATE messages SET content=?, finish_reason=?, meta=? WHERE id=?",
                        (content, finish_reason, json.dumps(meta), message_id))
        rows = self._read("SELECT conversation_id FROM messages WHERE id=?", (message_id,))
        if rows:
            self._touch(int(rows[0][0]), time.time())

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass

    def __enter__(self) -> "ConversationStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
