"""The TUI's memory over a long session (issue 31, item 7: RSS flat after the first 200
of 2,000 keys, `bench/bench_tui_rss.py`): what a session repeats leaves nothing behind."""

from __future__ import annotations

import gc

import pytest
from textual.widgets._footer import FooterKey
from tui_support import make_app, run_async, settle

from cocoviz.tui.widgets.footer import KeyFooter


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


def _live_footer_keys(footer: KeyFooter) -> int:
    """FooterKey widgets alive that belong to `footer` (mounted or removed)."""
    gc.collect()
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, FooterKey) and (o._parent is footer or _was_in(o, footer))
    )


def _was_in(key: FooterKey, footer: KeyFooter) -> bool:
    node = key._parent
    while node is not None:
        if node is footer:
            return True
        node = node._parent
    return False


@run_async
async def test_the_footer_keeps_no_key_it_removed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The footer is composed again at each change of focus; Textual's `data_bind` of a
    key's `compact` added a watcher to the footer that held every removed key."""
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        footer = app.query_one(KeyFooter)
        for _ in range(12):
            await pilot.press("tab")
            await pilot.pause()
        mounted = len(footer.query(FooterKey))
        assert mounted > 0
        watchers = getattr(footer, "__watchers", {})
        assert sum(len(v) for v in watchers.values()) <= mounted
        assert _live_footer_keys(footer) <= mounted
        # The compact style still reaches every key.
        footer.compact = True
        await pilot.pause()
        assert all(k.compact and k.has_class("-compact") for k in footer.query(FooterKey))
        footer.compact = False
        await pilot.pause()
        assert not any(k.compact or k.has_class("-compact") for k in footer.query(FooterKey))
