"""Init images VAE-encoded when their requests join, together where their sizes allow.

A request that starts from an image needs the image's latent distribution once, in its
prepare_encode. When several such requests join the same engine step, the runner first
hands them all to `encode_images`: their images go through the VAE encoder in one call per
image size, and each prepare_encode then finds its image here. Entries are keyed by the
image's content digest (`GenerationParams.init_image_digest`), so a strength sweep over one
picture encodes it once. What is kept is deterministic (the encoder's output, before any
sampling): sampling uses each request's own generator in its prepare_encode.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

from PIL import Image

from pipelines.params import GenerationParams

DEFAULT_CAPACITY = 8  # images; a 1024x1024 FLUX latent distribution is ~2 MB in float32

# Same-size images, their height and width -> one encoding per image, in order.
EncodeImages = Callable[[list[Image.Image], int, int], list[Any]]


class ImageEncodingCache:
    """Init-image digest -> its encoding, least recently used evicted first."""

    def __init__(self, encode_images: EncodeImages, capacity: int = DEFAULT_CAPACITY) -> None:
        self._encode_images = encode_images
        self.capacity = capacity
        self._entries: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def encode_many(self, params: Sequence[GenerationParams]) -> None:
        """Encode every init image not cached yet: one encoder call per image size."""
        by_size: dict[tuple[int, int], dict[str, Image.Image]] = {}
        for p in params:
            if p.init_image is not None and p.init_image_digest not in self._entries:
                by_size.setdefault((p.height, p.width), {})[p.init_image_digest] = p.init_image
        for (height, width), images in by_size.items():
            encodings = self._encode_images(list(images.values()), height, width)
            for digest, encoding in zip(images, encodings):
                self._keep(digest, encoding)

    def encode(self, params: GenerationParams) -> Any:
        """The encoding of this request's init image (from the cache, or encoded now)."""
        digest = params.init_image_digest
        with self._lock:
            if digest in self._entries:
                self._entries.move_to_end(digest)
                return self._entries[digest]
        [encoding] = self._encode_images([params.init_image], params.height, params.width)
        self._keep(digest, encoding)
        return encoding

    def _keep(self, digest: str, encoding: Any) -> None:
        with self._lock:
            self._entries[digest] = encoding
            self._entries.move_to_end(digest)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
