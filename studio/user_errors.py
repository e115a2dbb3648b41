"""Errors a Gradio caller sees: its own mistake or a busy server, shown as a message, not a crash."""

from __future__ import annotations

import contextlib
import html
from typing import Iterator

import gradio as gr

from engine import AdmissionError


def user_error(message: str, title: str) -> gr.Error:
    """A gr.Error for the user's own mistake or a busy server: shown as text (the modal renders
    HTML), and no traceback in the server's log for it."""
    return gr.Error(html.escape(message, quote=False), title=title, print_exception=False)


@contextlib.contextmanager
def engine_errors_as_gradio() -> Iterator[None]:
    """Show the engine's own message to the user for bad input or a full server."""
    try:
        yield
    except (ValueError, AdmissionError) as exc:
        raise user_error(str(exc), "Request not accepted") from None
