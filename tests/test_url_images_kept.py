"""`response_format="url"` images kept across a restart (studio/api/image_files.py with a folder and
the studio's store): a new process on the same outputs folder serves the same bytes under the same
names until they expire, and nothing is left behind that no row names."""

from __future__ import annotations

from studio.api.image_files import ImageFileStore
from studio.store.store import StudioStore
from tests.test_http_api import FakeClock


def kept_store(folder, clock, **limits) -> tuple[ImageFileStore, StudioStore]:
    """A store as a studio opens it at start on `folder` (an earlier process's images taken back)."""
    index = StudioStore.open(folder)
    images = ImageFileStore(ttl_s=100, clock=clock, folder=folder / "url-images", store=index, **limits)
    images.load()
    return images, index


def test_a_url_image_answers_with_the_same_bytes_after_a_restart_until_it_expires(tmp_path):
    clock = FakeClock()
    first, index = kept_store(tmp_path, clock)
    early = first.put(b"\x89PNG early", owner="http:key:alice")
    clock.now = 50.0
    late = first.put(b"\x89PNG late", owner="http:key:bob")
    index.close()  # the process ends; nothing in memory survives

    clock.now = 99.0
    second, index = kept_store(tmp_path, clock)
    assert (second.get(early), second.get(late), len(second), second.total_bytes) == (
        b"\x89PNG early", b"\x89PNG late", 2, 19)
    clock.now = 100.0  # the first one's time is up: its row and its file go
    assert (second.get(early), second.get(late)) == (None, b"\x89PNG late")
    assert sorted(path.name for path in (tmp_path / "url-images").iterdir()) == [late]
    assert [row[0] for row in index.url_images()] == [late]
    index.close()

    clock.now = 151.0  # expired while no studio ran: dropped at start
    third, index = kept_store(tmp_path, clock)
    assert (third.get(late), len(third), list((tmp_path / "url-images").iterdir()), index.url_images()) == (
        None, 0, [], [])
    index.close()


def test_room_is_shared_as_before_and_what_is_pushed_out_leaves_the_disk(tmp_path):
    clock = FakeClock()
    images, index = kept_store(tmp_path, clock, max_files=4, max_files_per_owner=2)
    alice = [images.put(b"a%d" % i, owner="alice") for i in range(3)]  # her third pushes her first out
    bob = [images.put(b"b%d" % i, owner="bob") for i in range(2)]
    assert [images.get(name) for name in alice] == [None, b"a1", b"a2"]
    index.close()
    again, index = kept_store(tmp_path, clock, max_files=4, max_files_per_owner=2)
    assert [again.get(name) for name in alice[1:] + bob] == [b"a1", b"a2", b"b0", b"b1"]
    assert sorted(path.name for path in (tmp_path / "url-images").iterdir()) == sorted(alice[1:] + bob)
    index.close()


def test_a_file_written_just_before_a_crash_without_its_row_is_deleted_at_start(tmp_path):
    clock = FakeClock()
    images, index = kept_store(tmp_path, clock)
    kept = images.put(b"kept")
    (tmp_path / "url-images" / "orphan.png").write_bytes(b"written, row never committed")
    index.close()
    again, index = kept_store(tmp_path, clock)
    assert [path.name for path in (tmp_path / "url-images").iterdir()] == [kept]
    assert again.get("orphan.png") is None and again.get(kept) == b"kept"
    index.close()


def test_without_a_folder_the_images_stay_in_memory_and_folder_and_store_go_together(tmp_path):
    images = ImageFileStore()
    assert images.load() == 0 and images.get(images.put(b"in memory")) == b"in memory"
    try:
        ImageFileStore(folder=tmp_path)
    except ValueError as error:
        assert "folder and store go together" in str(error)
    else:
        raise AssertionError("a folder without a store was accepted")
