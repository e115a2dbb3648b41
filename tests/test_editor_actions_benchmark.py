"""The editor-actions benchmark's parts that need no browser: the check that a hand-built graph is
the X/Y example, and the counting (the full run drives Chromium; its figures are quoted in
docs/benchmarks.md)."""

from __future__ import annotations

import copy
import json

from benchmarks import editor_actions

EXAMPLE = json.loads(editor_actions.EXAMPLE.read_text())


def test_a_built_graph_matches_the_example_whatever_its_ids_positions_and_number_formats():
    built = copy.deepcopy(EXAMPLE)
    renumber = {n["id"]: str(int(n["id"]) + 40) for n in built["nodes"]}
    for node in built["nodes"]:
        node["id"], node["position"] = renumber[node["id"]], [0, 0]
        node["values"] = {k: str(v) for k, v in node["values"].items()}  # what the editor's fields hold
    for link in built["links"]:
        link["from"]["node"], link["to"]["node"] = renumber[link["from"]["node"]], renumber[link["to"]["node"]]
    assert editor_actions.shape(built) == editor_actions.shape(EXAMPLE)


def test_a_wrong_link_or_value_does_not_match():
    swapped = copy.deepcopy(EXAMPLE)
    swapped["links"][2]["to"]["port"], swapped["links"][3]["to"]["port"] = "steps", "guidance"  # sweeps crossed
    assert editor_actions.shape(swapped) != editor_actions.shape(EXAMPLE)
    seed = copy.deepcopy(EXAMPLE)
    seed["nodes"][1]["values"]["seed"] = 8
    assert editor_actions.shape(seed) != editor_actions.shape(EXAMPLE)


def test_typed_text_is_one_action_and_a_key_press_per_character():
    class Keyboard:
        def type(self, text):
            pass

        def press(self, chord):
            pass

    class Page:
        keyboard = Keyboard()

    recorder = editor_actions.Recorder(Page())
    recorder.type("5, 10, 20")
    recorder.key("Enter")
    assert recorder.totals() == {"actions": 2, "key presses and mouse actions": 10, "clicks": 0, "drags": 0,
                                 "key chords": 1, "typed texts": 1, "typed characters": 9}
