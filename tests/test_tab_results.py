"""A tab's results on the server (studio.page.tab_queue.TabResults): the order its gallery lists
them in, and which of a tab's overlapping Generate streams sends the gallery it ends with."""

from studio.page.tab_queue import TabResults


def test_results_are_listed_by_when_they_were_asked_for_not_when_they_finished():
    results = TabResults()
    results.add("tab", (2, 0), "third", "c")
    results.add("tab", (1, 1), "second", "b")
    results.add("tab", (1, 0), "first", "a")
    results.add("other tab", (1, 0), "someone else's", "x")
    assert results.of("tab") == [("third", "c"), ("second", "b"), ("first", "a")]
    results.forget("tab")
    assert results.of("tab") == [] and results.of("other tab") == [("someone else's", "x")]


def test_only_the_last_stream_of_a_tab_to_end_sends_the_whole_gallery():
    # Three quick clicks: three streams follow their runs at once; the first two to end must not
    # send the gallery last (theirs may be older than a later stream's), the third one must.
    results = TabResults()
    for _ in range(3):
        results.stream_started("tab")
    results.stream_started("other tab")
    assert results.stream_ended("tab") is False
    assert results.stream_ended("tab") is False
    assert results.stream_ended("other tab") is True  # tabs count alone
    assert results.stream_ended("tab") is True
    # A click after that starts counting again from one.
    results.stream_started("tab")
    assert results.stream_ended("tab") is True
