"""The terminal chat driven with Textual's Pilot on a drafter pair, shared by the drafter kinds' tests."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from localspec.store.conversations import ConversationStore
from localspec.tui.app import ChatApp, ChatSettings
from localspec.tui.widgets import StatsPanel


def assert_chat_drafts_with(engine_factory: Callable, model_name: str, *, draft_max: int, drafter_row: str,
                            source: str) -> None:
    """The chat on ``engine_factory()``'s pair: F3's drafter row reads ``drafter_row``, and one
    reply (fixed policy, ``draft_max`` deep) drafts tokens filed under ``source``."""

    async def until(pilot, condition) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, "timed out waiting for the app"
            await pilot.pause(0.02)

    async def go(store):
        app = ChatApp(engine_factory, model_name=model_name, store=store,
                      settings=ChatSettings(max_tokens=16, policy="fixed", draft_max=draft_max))
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.engine is not None or app.load_error is not None)
            rows = dict(app.info_rows())
            assert rows["drafter"] == drafter_row, rows
            assert app.send("The quick brown fox")
            await until(pilot, lambda: app.replies_done == 1)
            stats = app.query_one(StatsPanel).stats
            assert stats.spec and stats.sources.get(source, [0, 0, 0])[1] > 0, stats.sources

    store = ConversationStore()
    try:
        asyncio.run(go(store))
    finally:
        store.close()
