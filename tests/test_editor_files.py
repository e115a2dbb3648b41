"""The node editor's browser files: every one is served, in an order that works, and none grows past
what one concern should hold."""

from __future__ import annotations

from studio.page.workflow_tab import EDITOR_FILES, EDITOR_KIT, EDITOR_METHODS, WEB_DIR, editor_head

MOST_LINES = 450  # one concern per file (docs/workflows.md); node_editor.js was once 1,075 lines


def test_every_editor_file_is_served_once_with_the_kit_first_and_the_editor_last():
    on_disk = sorted(path.name for path in WEB_DIR.glob("*.js") if path.name != "lightbox.js")
    assert sorted(EDITOR_FILES) == on_disk and len(set(EDITOR_FILES)) == len(EDITOR_FILES)
    assert EDITOR_FILES[0] == EDITOR_KIT[0] == "editor_kit.js" and EDITOR_FILES[-1] == "node_editor.js"
    # The methods' files load before node_editor.js joins them to its class.
    assert all(EDITOR_FILES.index(name) < EDITOR_FILES.index("node_editor.js") for name in EDITOR_METHODS)
    head = editor_head()
    served = [name for name in EDITOR_FILES if f"{WEB_DIR / name}?v=" in head]
    assert served == list(EDITOR_FILES)
    assert [head.index(f"{WEB_DIR / name}?v=") for name in EDITOR_FILES] == sorted(
        head.index(f"{WEB_DIR / name}?v=") for name in EDITOR_FILES)


def test_no_editor_file_holds_more_than_one_concerns_worth_of_lines():
    lengths = {name: len((WEB_DIR / name).read_text().splitlines()) for name in EDITOR_FILES}
    assert {name: n for name, n in lengths.items() if n > MOST_LINES} == {}
