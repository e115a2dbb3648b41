"""A model family loads quietly: while it is imported and its checkpoint read, diffusers and
transformers log errors only and draw no progress bars ("Loading pipeline components...",
"Loading weights"), so that what a starting studio or replica prints is its own log.

pipelines/loader.py loads every family under `quiet_libraries()`, the one place that says so
(`load_pipeline` and `load_models`, and so serve replicas, go through it). Errors still raise and
the libraries' error records still print; every setting is restored afterwards. A library whose
verbosity the user chose (DIFFUSERS_VERBOSITY, TRANSFORMERS_VERBOSITY) keeps it. A hub download
happens before, with its progress bars.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Within: diffusers and transformers at ERROR, their progress bars off."""
    import huggingface_hub.utils as hub
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    libraries = {diffusers_logging: "DIFFUSERS_VERBOSITY", transformers_logging: "TRANSFORMERS_VERBOSITY"}
    before = [(library, library.get_verbosity(), library.is_progress_bar_enabled()) for library in libraries]
    hub_bars = not hub.are_progress_bars_disabled()  # transformers' switch turns the hub's too
    for library, variable in libraries.items():
        if variable not in os.environ:
            library.set_verbosity(logging.ERROR)
        library.disable_progress_bar()
    try:
        yield
    finally:
        for library, verbosity, bars in before:
            library.set_verbosity(verbosity)
            if bars:
                library.enable_progress_bar()
        if hub_bars and hub.are_progress_bars_disabled():  # as they were before transformers' switch
            hub.enable_progress_bars()
        elif not hub_bars and not hub.are_progress_bars_disabled():
            hub.disable_progress_bars()
