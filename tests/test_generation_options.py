"""One builder of GenerationConfig: the same values through ``localspec generate``'s builder, the
chat's settings, a server request and ``bench``/``serve``'s policy give equal configurations, and
"policy fixed drafts 4 unless told otherwise" holds in every one of them, the chat included."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from localspec.cli.generate import build_config
from localspec.cli.spec_options import Policy, Source, Tree, default_draft_max
from localspec.core.errors import LocalspecError
from localspec.runtime.engine import GenerationConfig
from localspec.runtime.generation_options import FIXED_DRAFT_MAX, GenerationOptions
from localspec.runtime.sampling import SamplingParams
from localspec.server.params import ServeDefaults, generation_config
from localspec.server.schemas import ChatCompletionRequest
from localspec.speculation.policy import PolicyConfig
from localspec.tui.app import ChatSettings

VALUES = dict(max_tokens=77, temperature=0.7, top_k=20, top_p=0.9, min_p=0.1, seed=5, repeat_penalty=1.2,
              repeat_last_n=32, presence_penalty=0.3, frequency_penalty=0.1, stop=["###", "END"],
              policy=Policy.fixed, draft_max=None, tree=Tree.off, p_min=0.25)


def _server_config(values: dict) -> GenerationConfig:
    """What `localspec serve` builds: the policy once from the flags, the rest from each request."""
    policy = GenerationOptions.from_values(values).policy_config()
    defaults = ServeDefaults(n_ctx=4096, policy=policy)
    sampling = {k: values[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty",
                                       "repeat_last_n", "presence_penalty", "frequency_penalty")}
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=values["max_tokens"],
                                stop=values["stop"], **sampling)
    return generation_config(req, defaults, req.max_tokens)


def test_cli_chat_and_server_build_equal_configs():
    cli = build_config(**VALUES, source=Source.auto)
    chat = ChatSettings(system="be brief", **{**VALUES, "policy": "fixed", "tree": "off",
                                              "stop": tuple(VALUES["stop"])}).config(True)
    server = _server_config(VALUES)
    assert cli == chat == server
    assert cli.policy == PolicyConfig(name="fixed", draft_max=FIXED_DRAFT_MAX, tree="off", p_min=0.25)
    assert cli.sampling == SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.1, seed=5,
                                          repeat_penalty=1.2, repeat_last_n=32, presence_penalty=0.3,
                                          frequency_penalty=0.1)
    assert cli.stop == ("###", "END") and cli.max_tokens == 77


def test_fixed_drafts_four_by_default_everywhere_the_chat_included():
    assert default_draft_max(Policy.fixed, None) == FIXED_DRAFT_MAX == 4
    assert default_draft_max(Policy.auto, None) == PolicyConfig().draft_max
    chat = ChatSettings(policy="fixed")
    assert chat.config(True).policy.draft_max == 4 and chat.effective_draft_max == 4
    assert ChatSettings().config(True).policy.draft_max == PolicyConfig().draft_max   # auto: 16
    assert replace(chat, draft_max=9).config(True).policy.draft_max == 9              # a given value wins
    assert build_config(max_tokens=8, policy=Policy.fixed, draft_max=None).policy.draft_max == 4
    assert _server_config({**VALUES, "policy": "fixed"}).policy.draft_max == 4


def test_defaults_are_the_engines_and_ranges_are_checked_once():
    assert GenerationOptions().to_config() == GenerationConfig()
    policy = PolicyConfig(name="fixed", draft_max=3, p_min=0.5, probe_every=8, source="eagle", tree="on",
                          tree_width=2, tree_nodes=10, lookup_max=40, recall=False)   # every field survives
    assert {f.name for f in fields(PolicyConfig) if getattr(policy, f.name) == getattr(PolicyConfig(), f.name)} == set()
    assert GenerationOptions.from_config(SamplingParams(), policy).policy_config() == policy
    assert GenerationOptions(lookup_max=12).policy_config().lookup_max == 12   # it was dropped on the way
    with pytest.raises(LocalspecError, match="draft_max"):
        GenerationOptions(draft_max=33).to_config()
    with pytest.raises(LocalspecError, match="min_p"):
        ChatSettings(min_p=1.5).config(True)


def test_choosing_fixed_in_the_settings_dialog_drafts_four(smollm2, isolated_home):
    import asyncio

    from textual.widgets import Input, Select

    from localspec.runtime.engine import Engine
    from localspec.store.conversations import ConversationStore
    from localspec.tui.app import ChatApp, SettingsScreen

    store = ConversationStore()

    async def go():
        app = ChatApp(lambda: Engine(smollm2, n_ctx=512, n_threads=1), model_name="smollm2-135m", store=store)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("f2")
            assert isinstance(app.screen, SettingsScreen)
            assert app.screen.query_one("#set-draft-max", Input).value == "16"   # auto's default, as shown
            app.screen.query_one("#set-policy", Select).value = "fixed"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert not isinstance(app.screen, SettingsScreen)
            assert app.settings.policy == "fixed" and app.settings.config(True).policy.draft_max == 4
            await pilot.press("f2")
            app.screen.query_one("#set-draft-max", Input).value = "9"              # a value the user types
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.settings.draft_max == 9 and app.settings.config(True).policy.draft_max == 9

    try:
        asyncio.run(go())
    finally:
        store.close()
