"""The terminal chat, driven with Textual's Pilot against the real SmolLM2-135M engine.

Screens are compared as text snapshots (tests/snapshots/*.txt): the plain characters of an 80x24
screen, taken only where nothing depends on timing. Regenerate them with
``LOCALSPEC_UPDATE_SNAPSHOTS=1 pytest tests/test_tui.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest
from rich.text import Text
from textual.widgets import Input, Markdown, Sparkline, Static

from localspec.cli import main
from localspec.store.conversations import ConversationStore
from localspec.runtime.engine import Engine
from localspec.core.errors import LocalspecError
from localspec.core.events import GenerationStats
from localspec.tui.app import (LOOKUP_NOTE, ChatApp, ChatSettings, ConversationsScreen, InfoScreen,
                               SettingsScreen)
from localspec.tui.widgets import DRAFT_STYLE, AssistantMessage, StatsPanel, UserMessage, render_histogram

SNAPSHOTS = Path(__file__).parent / "snapshots"
SIZE = (80, 24)


# -- helpers -------------------------------------------------------------------------------------
# the status line's calibration state (runtime.calibrator: a fresh home calibrates in the background,
# so "· calibrating ..." comes and goes with time, and may be cut at the screen's edge): not compared
CALIBRATION = re.compile(r" ·( (calibrat.*|c(a(l(i(b(r(a(t)?)?)?)?)?)?)?)?)?$")


def screen_text(app) -> str:
    """The characters of the current screen, one line per row (styles dropped; the status line
    without the background calibration's state)."""
    strips = app.screen._compositor.render_strips()
    lines = [strip.text.rstrip() for strip in strips]
    if lines:
        lines[0] = CALIBRATION.sub("", lines[0])
    return "\n".join(lines)


def assert_snapshot(app, name: str) -> None:
    text = screen_text(app) + "\n"
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("LOCALSPEC_UPDATE_SNAPSHOTS") or not path.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not os.environ.get("LOCALSPEC_UPDATE_SNAPSHOTS"):
            pytest.fail(f"snapshot {path.name} was missing and has been written; run again")
    assert text == path.read_text(encoding="utf-8"), f"screen differs from {path}"


async def wait_for(pilot, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)
    await pilot.pause()


async def loaded(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.engine is not None or app.load_error is not None)


def run(coro) -> None:
    asyncio.run(coro)


@pytest.fixture
def factory(smollm2):
    def make():
        from engine_checks import seed_calibration
        from localspec.core.paths import user_dir
        engine = Engine(smollm2, n_ctx=512, n_threads=2)
        seed_calibration(user_dir() / "calibration.json", engine.cost_key())
        return engine
    return make


@pytest.fixture
def store(isolated_home):
    s = ConversationStore()
    yield s
    s.close()


def make_app(factory, store, **settings) -> ChatApp:
    return ChatApp(factory, model_name="smollm2-135m", store=store,
                   settings=ChatSettings(max_tokens=settings.pop("max_tokens", 16), **settings))


def seed_conversation(store: ConversationStore) -> int:
    cid = store.create(model="smollm2-135m", system="You are a terse assistant.")
    store.add_message(cid, "user", "What is the capital of France?")
    answer = "The capital of France is **Paris**."
    spans = [[answer.index(w), answer.index(w) + len(w)] for w in ("capital", "Paris")]
    store.add_message(cid, "assistant", answer, finish_reason="stop",
                      meta={"stats": {"n_tokens": 9, "tokens_per_second": 120.5, "spec": True,
                                      "acceptance_rate": 0.5, "tokens_per_cycle": 2.25},
                            "drafted_spans": spans})
    return cid


# -- screens -------------------------------------------------------------------------------------
def test_first_screen_snapshot_80x24(factory, store):
    async def go():
        app = make_app(factory, store)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            # the footer fills in on a later refresh (late on a busy machine)
            await wait_for(pilot, lambda: "^q Quit" in screen_text(app).splitlines()[-1])
            assert app.query_one("#prompt", Input).has_focus
            assert_snapshot(app, "first_screen")
            text = screen_text(app)
            assert LOOKUP_NOTE in text and "speculation ON" in text   # no drafter: lookup still drafts
            # every binding is visible in the footer at 80 columns
            for key in ("^t Spec", "^g Drafts", "^n New", "^o Chats", "f2 Setup", "f3 Info", "f4 Stats", "^q Quit"):
                assert key in text.splitlines()[-1]
    run(go())


def test_send_message_streams_stats_and_saves(factory, store):
    async def go():
        app = make_app(factory, store, max_tokens=16)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await pilot.press(*"Hi!")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.replies_done == 1)
            reply = app.query(AssistantMessage).last()
            assert reply.content.strip()
            assert reply.finish_reason in ("stop", "length")
            panel = app.query_one(StatsPanel)
            assert panel.stats is not None and 0 < panel.stats.generated_tokens <= 16
            numbers = str(app.query_one("#stats-numbers", Static).render())
            assert "tok/s" in numbers
            assert app.query_one("#stats-spark", Sparkline).data            # recent tok/s recorded
            assert app.query_one("#prompt", Input).value == ""
            assert [m.role for m in app.history] == ["user", "assistant"]
            conv = store.load(app.conversation_id)
            assert [(m.role, m.content) for m in conv.messages] == [("user", "Hi!"), ("assistant", reply.content)]
            assert conv.messages[1].finish_reason == reply.finish_reason
            assert conv.messages[1].meta["stats"]["n_tokens"] == panel.stats.generated_tokens
    run(go())


def test_cancel_a_reply_then_the_next_one_works(factory, store):
    async def go():
        app = make_app(factory, store, max_tokens=400)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert app.send("Write a very long story about a dragon who loves tea.")
            reply = app.query(AssistantMessage).last()
            await wait_for(pilot, lambda: reply.chunks)
            assert not app.send("another one")                      # refused while generating
            assert "esc Cancel" in screen_text(app).splitlines()[-1]
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.replies_done == 1)
            assert reply.finish_reason == "cancelled"
            assert 0 < app.query_one(StatsPanel).stats.generated_tokens < 400
            assert "cancelled" in str(reply.query_one(".reply-meta", Static).render())
            stored = store.load(app.conversation_id).messages[-1]
            assert stored.finish_reason == "cancelled" and stored.content == reply.content

            app.settings.max_tokens = 8
            assert app.send("Thanks!")
            await wait_for(pilot, lambda: app.replies_done == 2)
            second = app.query(AssistantMessage).last()
            assert second.finish_reason in ("stop", "length") and second.content.strip()
            assert len(store.load(app.conversation_id).messages) == 4
    run(go())


def test_quitting_mid_reply_stops_the_engine_and_keeps_the_partial_reply(factory, store):
    async def go():
        app = make_app(factory, store, max_tokens=400)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert app.send("Write a very long story about a dragon who loves tea.")
            reply = app.query(AssistantMessage).last()
            await wait_for(pilot, lambda: reply.chunks)
            started = time.monotonic()
            await pilot.press("ctrl+q")
        assert time.monotonic() - started < 5
        return app

    app = asyncio.run(go())
    assert app.engine is None                                   # closed after the worker stopped
    stored = store.load(app.conversation_id).messages[-1]
    assert stored.finish_reason == "cancelled" and stored.content


def test_toggle_speculation(factory, store):
    async def go():
        app = make_app(factory, store, max_tokens=6)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert app.spec_enabled and app.settings.config(app.spec_enabled).spec
            await pilot.press("ctrl+t")
            assert not app.spec_enabled
            assert not app.settings.config(app.spec_enabled).spec
            # no drafter: speculation (n-gram lookup) is off now, and the status says so
            assert "speculation OFF" in str(app.status_text())
            assert app.send("Hello")
            await wait_for(pilot, lambda: app.replies_done == 1)
            stats = store.load(app.conversation_id).messages[-1].meta["stats"]
            assert stats["spec"] is False
            await pilot.press("ctrl+t")
            assert app.spec_enabled
            rows = dict(app.info_rows())
            assert rows["drafter"] == f"none: {LOOKUP_NOTE}" and rows["speculation"] == "on"
            assert LOOKUP_NOTE in str(app.status_text())
    run(go())


def test_resume_a_conversation_snapshot_and_continue(factory, store):
    cid = seed_conversation(store)

    async def go():
        app = ChatApp(factory, model_name="smollm2-135m", store=store, settings=ChatSettings(max_tokens=8),
                      resume=cid)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert app.conversation_id == cid
            assert app.settings.system == "You are a terse assistant."
            assert [m.role for m in app.history] == ["user", "assistant"]
            assert_snapshot(app, "resumed")
            assert app.send("And of Italy?")
            await wait_for(pilot, lambda: app.replies_done == 1)
            stats = app.query_one(StatsPanel).stats
            # the whole history (and the system prompt) went into the prompt
            alone = app.engine.prompt_tokens([{"role": "user", "content": "And of Italy?"}])
            assert stats.prompt_tokens > len(alone) + 10
        assert [m.role for m in store.load(cid).messages] == ["user", "assistant"] * 2
    run(go())


def test_conversation_list_resumes_the_chosen_one(factory, store):
    first = seed_conversation(store)
    second = store.create(model="smollm2-135m")
    store.add_message(second, "user", "Tell me a joke")

    async def go():
        app = make_app(factory, store)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await pilot.press("ctrl+o")
            assert isinstance(app.screen, ConversationsScreen)
            text = screen_text(app)
            assert "Tell me a joke" in text and "capital of France" in text
            app.screen.query_one("#conversation-list").highlighted = 1    # newest first: row 1 is `first`
            await pilot.press("enter")
            await pilot.pause()
            assert not isinstance(app.screen, ConversationsScreen)
            assert app.conversation_id == first
            assert [w.message for w in app.query(UserMessage)] == ["What is the capital of France?"]
            await pilot.press("ctrl+n")
            assert app.conversation_id is None and not app.history
            assert not list(app.query(UserMessage))
    run(go())


def test_highlight_drafted_tokens_toggle(factory, store):
    cid = seed_conversation(store)

    async def go():
        app = ChatApp(factory, model_name="smollm2-135m", store=store, resume=cid)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            reply = app.query_one(AssistantMessage)
            assert reply.query_one(Markdown).display
            await pilot.press("ctrl+g")
            assert app.highlight and reply.highlight
            plain = reply.query_one(".reply-text", Static)
            assert plain.display and not reply.query_one(Markdown).display
            rendered = plain.content
            assert isinstance(rendered, Text)
            drafted = [rendered.plain[s.start:s.end] for s in rendered.spans if str(s.style) == DRAFT_STYLE]
            assert drafted == ["capital", "Paris"]
            await pilot.press("ctrl+g")
            assert reply.query_one(Markdown).display and not plain.display
    run(go())


def test_settings_dialog_validates_and_applies(factory, store):
    cid = seed_conversation(store)

    async def go():
        app = ChatApp(factory, model_name="smollm2-135m", store=store, resume=cid)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await pilot.press("f2")
            assert isinstance(app.screen, SettingsScreen)
            assert_snapshot(app, "settings")
            app.screen.query_one("#set-max-tokens", Input).value = "lots"
            await pilot.press("ctrl+s")
            assert isinstance(app.screen, SettingsScreen)
            assert "max tokens: 'lots' is not an integer" in str(app.screen.query_one("#settings-error").render())
            app.screen.query_one("#set-max-tokens", Input).value = "12"
            app.screen.query_one("#set-top-p", Input).value = "7"
            await pilot.press("ctrl+s")
            assert "top-p" in str(app.screen.query_one("#settings-error").render())
            app.screen.query_one("#set-top-p", Input).value = "0.9"
            app.screen.query_one("#set-min-p", Input).value = "1.5"
            await pilot.press("ctrl+s")
            assert "min-p" in str(app.screen.query_one("#settings-error").render())
            app.screen.query_one("#set-min-p", Input).value = "0.1"
            app.screen.query_one("#set-repeat-penalty", Input).value = "0"
            await pilot.press("ctrl+s")
            assert "repeat penalty" in str(app.screen.query_one("#settings-error").render())
            for widget, value in (("#set-repeat-penalty", "1.2"), ("#set-repeat-last-n", "-1"),
                                  ("#set-presence-penalty", "0.5"), ("#set-frequency-penalty", "-0.25")):
                app.screen.query_one(widget, Input).value = value
            app.screen.query_one("#set-system").text = "Answer in French."
            app.screen.query_one("#set-rows-match").value = True   # exact mode (rows_match) for the next reply
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert not isinstance(app.screen, SettingsScreen)
            assert app.settings.max_tokens == 12 and app.settings.top_p == 0.9 and app.settings.min_p == 0.1
            assert (app.settings.repeat_penalty, app.settings.repeat_last_n, app.settings.presence_penalty,
                    app.settings.frequency_penalty) == (1.2, -1, 0.5, -0.25)
            sampling = app.settings.config(True).sampling      # what the next reply samples with
            assert (sampling.min_p, sampling.repeat_penalty, sampling.frequency_penalty) == (0.1, 1.2, -0.25)
            assert app.settings.rows_match is True and app.settings.config(True).rows_match is True
            assert store.load(cid).system == "Answer in French."
    run(go())


def test_info_panel_snapshot(factory, store):
    async def go():
        app = make_app(factory, store)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await pilot.press("f3")
            assert isinstance(app.screen, InfoScreen)
            assert_snapshot(app, "info")
            await pilot.press("escape")
            assert not isinstance(app.screen, InfoScreen)
    run(go())


def test_stats_panel_with_a_drafter_and_hidden_toggle(factory, store):
    """The live panel as a drafter run fills it: acceptance, tok/cycle, histogram by depth."""
    async def go():
        app = make_app(factory, store)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            panel = app.query_one(StatsPanel)
            stats = GenerationStats(prompt_tokens=20, generated_tokens=30, generation_seconds=0.2, cycles=12,
                                    spec=True)
            for drafted, accepted in [(4, 4), (4, 2), (3, 0), (4, 3)] * 3:
                stats.record_cycle(drafted, accepted)
            panel.update_stats(stats)
            later = stats.snapshot()
            later.generated_tokens, later.generation_seconds = 45, 0.3
            panel.update_stats(later)
            await pilot.pause()
            numbers = str(app.query_one("#stats-numbers", Static).render())
            assert "150.0 tok/s" in numbers and f"{stats.acceptance_rate:.0%}" in numbers and f"{later.tokens_per_cycle:.2f}" in numbers
            hist = str(app.query_one("#stats-histogram", Static).render()).splitlines()
            assert [line.split()[0] for line in hist] == ["d1", "d2", "d3", "d4"]
            assert "75%" in hist[0] and "50%" in hist[2]
            assert app.query_one("#stats-spark", Sparkline).data == pytest.approx([150.0, 150.0])
            await pilot.press("f4")
            assert not panel.display
    run(go())


def test_histogram_rendering():
    assert render_histogram([], []).plain == "no drafts yet"
    text = render_histogram([3, 1], [4, 4], width=8).plain.splitlines()
    assert text[0].startswith("d1 ██████") and text[0].rstrip().endswith("75% 4")
    assert text[1].startswith("d2 ██ ") and "25%" in text[1]


# -- errors stay in the UI -----------------------------------------------------------------------
@pytest.mark.parametrize("exc, shown", [(LocalspecError("the file is not a GGUF"), "the file is not a GGUF"),
                                        (RuntimeError("boom"), "RuntimeError: boom")])
def test_a_model_that_fails_to_load_is_reported_in_the_ui(store, exc, shown):
    def broken():
        raise exc

    async def go():
        app = ChatApp(broken, model_name="broken", store=store)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert "model failed to load" in screen_text(app)
            notes = [str(n.render()) for n in app.query(".error-note")]
            assert any(shown in n for n in notes)
            assert app.query_one("#prompt", Input).disabled
            assert not app.send("hello")
    run(go())


def test_a_prompt_too_long_for_the_context_is_an_error_line_and_the_app_goes_on(factory, store):
    async def go():
        app = make_app(factory, store, max_tokens=6)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert app.send("tea " * 800)
            await wait_for(pilot, lambda: app.replies_done == 1)
            notes = [str(n.render()) for n in app.query(".error-note")]
            assert any("more than the context" in n for n in notes)
            assert app.query(AssistantMessage).last().finish_reason == "error"
            assert app.send("Hi")
            await wait_for(pilot, lambda: app.replies_done == 2)
            assert app.query(AssistantMessage).last().finish_reason in ("stop", "length")
    run(go())


def test_resuming_an_unknown_conversation_is_shown_in_the_ui(factory, store):
    async def go():
        app = ChatApp(factory, model_name="smollm2-135m", store=store, resume=42)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert "no conversation with id 42" in screen_text(app)
    run(go())


# -- the command line ----------------------------------------------------------------------------
def test_cli_list_and_bad_arguments(store, capsys):
    assert main(["chat", "--list"]) == 0
    assert "No saved conversations" in capsys.readouterr().out
    seed_conversation(store)
    assert main(["chat", "--list"]) == 0
    out = capsys.readouterr().out
    assert "What is the capital of France?" in out and "smollm2-135m" in out
    for args, message in [(["--resume", "77"], "no conversation with id 77"),
                          (["--resume", "soon"], "--resume takes a conversation id"),
                          (["--target", "/nonexistent/x.gguf"], "does not exist"),
                          ([], "interactive terminal")]:           # pytest's stdin is not a terminal
        assert main(["chat", *args]) == 1
        err = capsys.readouterr().err
        assert err.startswith("Error: ") and message in err and "Traceback" not in err


# -- end to end with the real default pair -------------------------------------------------------
def test_end_to_end_with_the_default_pair(store):
    """What `localspec chat` runs: the default model resolved and loaded as the CLI does it."""
    from localspec.cli.chat import engine_factory
    from localspec.store.models import DEFAULT_MODEL, resolve

    spec = resolve(None)
    factory = engine_factory(spec, ctx=1024, threads=2)

    async def go():
        app = ChatApp(factory, model_name=spec.name, store=store, settings=ChatSettings(max_tokens=12))
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert app.engine is not None, app.load_error
            if spec.drafter is None:
                assert LOOKUP_NOTE in screen_text(app)
            else:
                assert "speculation ON" in screen_text(app)
            rows = dict(app.info_rows())                 # the memory panel shows the fit plan
            assert "  weights" in rows and "KV" in rows["context"] and "CPU" in rows
            await pilot.press(*"What is 2+2?")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.replies_done == 1, timeout=60)
            reply = app.query(AssistantMessage).last()
            assert reply.content.strip() and reply.finish_reason in ("stop", "length")
            assert reply.content.strip()[:10] in screen_text(app)
        conv = store.load(store.latest_id())
        assert conv.model == DEFAULT_MODEL
        assert [m.role for m in conv.messages] == ["user", "assistant"]
        assert conv.messages[1].content == reply.content
    run(go())


# -- with a real drafter ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def repeat_pair(tmp_path_factory):
    """A tiny target that repeats its last token and a drafter that predicts exactly that."""
    from tiny_models import build_drafter, build_target

    d = tmp_path_factory.mktemp("tiny_pair")
    target = build_target(d / "target.gguf", "repeat")
    return target, build_drafter(d / "drafter.gguf", target, "repeat")


def test_speculation_stats_histogram_highlight_and_toggle_with_a_drafter(repeat_pair, store):
    target, drafter = repeat_pair

    async def go():
        app = ChatApp(lambda: Engine(target, drafter, n_ctx=512, n_threads=2), model_name="tiny-pair",
                      store=store, settings=ChatSettings(max_tokens=20, policy="fixed", draft_max=4))
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert app.has_drafter
            assert "speculation ON" in screen_text(app)
            rows = dict(app.info_rows())
            assert rows["speculation"] == "on" and rows["  variant"] and rows["  target layers"] == "0, 1, 3"
            assert "drafter weights" in rows and "drafter KV (f16, est.)" in rows

            await pilot.press("ctrl+g")                      # highlight drafted tokens while streaming
            assert app.send("Say yes")
            await wait_for(pilot, lambda: app.replies_done == 1)
            stats = app.query_one(StatsPanel).stats
            assert stats.spec and stats.drafted > 0 and stats.acceptance_rate > 0.9
            assert stats.tokens_per_cycle > 2
            numbers = str(app.query_one("#stats-numbers", Static).render())
            assert f"{stats.acceptance_rate:.0%}" in numbers
            hist = str(app.query_one("#stats-histogram", Static).render()).splitlines()
            assert hist[0].startswith("d1") and len(hist) == len(stats.drafted_per_position)
            reply = app.query(AssistantMessage).last()
            assert any(drafted for _, drafted in reply.chunks)
            shown = reply.query_one(".reply-text", Static).content
            assert any(str(s.style) == DRAFT_STYLE for s in shown.spans)
            saved = store.load(app.conversation_id).messages[-1].meta
            assert saved["drafted_spans"] and saved["stats"]["spec"] is True

            await pilot.press("ctrl+t")                      # speculation off for the next reply
            assert "speculation OFF" in screen_text(app)
            assert app.send("Again")
            await wait_for(pilot, lambda: app.replies_done == 2)
            stats = app.query_one(StatsPanel).stats
            assert not stats.spec and stats.drafted == 0
            assert "speculation off" in str(app.query_one("#stats-histogram", Static).render())
            assert not any(drafted for _, drafted in app.query(AssistantMessage).last().chunks)
    run(go())


def test_the_app_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, localspec.tui.app, localspec.cli.chat; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
