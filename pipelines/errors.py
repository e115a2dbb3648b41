"""The error every parameter check raises: it names the GenerationParams field it is about.

Front ends map it back to what the user touched without reading its text: the workflow
compiler to the node and port that set the field, the HTTP API to OpenAI's `param`. It is a
ValueError, so callers that catch ValueError keep working, and its text is the message.
"""

from __future__ import annotations


class ParamError(ValueError):
    """A request value the engine refuses. `field`: the GenerationParams field ("width",
    "num_inference_steps", "scheduler", ...); `message`: what was wrong, the value, what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    def __reduce__(self):
        # Rebuilt with both arguments when it crosses a process (a Ray Serve replica's refusal).
        return type(self), (self.field, self.message)
