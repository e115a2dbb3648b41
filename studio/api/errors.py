"""Errors of the HTTP API in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

OpenAI clients read the status code to pick an exception class and show `message`, so
every message says what was wrong, the value, and what is allowed. The routes raise
`ApiError` and turn it into a response themselves, so the studio's app needs no
exception handlers of ours.
"""

from __future__ import annotations

import pydantic
from fastapi.responses import JSONResponse

import engine
from pipelines.errors import ParamError

# Request fields the API exposes under another name.
_API_FIELD_OF = {"width": "size", "height": "size", "init_image": "image", "mask_image": "mask"}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def to_response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=headers)


def invalid_value(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_validation_error(error: pydantic.ValidationError) -> ApiError:
    """The first problem pydantic found, with the offending field as `param`."""
    first = error.errors(include_url=False)[0]
    location = [str(part) for part in first["loc"]]
    param = ".".join(location) or None
    kind = first["type"]
    if kind == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {first['msg']}.", code="invalid_json")
    if kind == "missing":
        return ApiError(400, f"{param} is required.", param=param, code="missing_required_parameter")
    if kind == "extra_forbidden":
        return ApiError(400, f"unknown parameter: {param}.", param=param, code="unknown_parameter")
    if kind == "model_type":
        return ApiError(400, "the request body must be a JSON object.", code="invalid_type")
    value = first.get("input")
    shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:77]}..."
    code = "invalid_type" if kind.endswith("_type") else "invalid_value"
    return invalid_value(f"{param}={shown} is not allowed: {first['msg']}.", param, code=code)


def from_engine_value_error(error: ValueError, renamed: dict[str, str] | None = None) -> ApiError:
    """Engine and pipeline checks (model limits, server caps) raise a ParamError naming its field.
    `renamed`: fields this route exposes under another name than the usual one (the edits route
    names a size that came from the uploaded image `image`)."""
    message = str(error)
    field = error.field if isinstance(error, ParamError) else None
    names = {**_API_FIELD_OF, **(renamed or {})}
    known = field in names or field in {
        "prompt", "negative_prompt", "num_inference_steps", "guidance_scale", "seed", "num_frames", "strength",
        "loras", "step_cache",
    }
    return invalid_value(message, names.get(field, field) if known else None)


def from_admission_error(error: engine.AdmissionError) -> ApiError:
    if isinstance(error, engine.EngineFailedError):
        return ApiError(503, str(error), type="server_error", code="engine_failed")
    if isinstance(error, engine.EngineClosedError):
        return ApiError(503, str(error), type="server_error", code="shutting_down")
    code = "session_limit" if isinstance(error, engine.SessionLimitError) else "queue_full"
    return ApiError(429, str(error), type="rate_limit_error", code=code, retry_after_s=1)


def unknown_model(requested: str, served: str | tuple[str, ...]) -> ApiError:
    names = ", ".join(repr(name) for name in ((served,) if isinstance(served, str) else served))
    return ApiError(
        404,
        f"model={requested!r} is not served here; this server serves {names} (see GET /v1/models).",
        param="model",
        code="model_not_found",
    )


def invalid_api_key() -> ApiError:
    return ApiError(
        401,
        "a valid API key is required: send 'Authorization: Bearer <key>' (the openai client's api_key).",
        code="invalid_api_key",
    )


def body_too_large(limit_bytes: int, hint: str = "prompts are limited to a few thousand characters") -> ApiError:
    return ApiError(
        413, f"the request body is larger than this server's limit of {limit_bytes} bytes; {hint}.",
        code="request_too_large",
    )


def generation_failed(message: str, engine_failed: bool = False) -> ApiError:
    if engine_failed:  # the engine itself went down: nothing here will work until a restart
        return ApiError(503, f"the image could not be generated: {message}", type="server_error", code="engine_failed")
    return ApiError(500, f"the image could not be generated: {message}", type="server_error", code="generation_failed")


def shutting_down(reason: str) -> ApiError:
    return ApiError(503, f"the server is shutting down ({reason}); try again once it is back.",
                    type="server_error", code="shutting_down")


def unsupported_media_type(media_type: str) -> ApiError:
    shown = repr(media_type[:100]) if media_type else "none"
    return ApiError(415, f"Content-Type {shown} is not accepted: send the body as application/json.",
                    code="unsupported_media_type")


def body_timeout(seconds: float) -> ApiError:
    return ApiError(408, f"the request body did not arrive within {seconds:g} s.", code="request_timeout")


def body_cut_short() -> ApiError:
    return ApiError(400, "the connection closed before the whole request body arrived.", code="body_cut_short")


def too_many_failed_attempts(message: str, retry_after_s: int) -> ApiError:
    return ApiError(429, message, type="rate_limit_error", code="too_many_failed_attempts",
                    retry_after_s=max(1, retry_after_s))


def generation_aborted(reason: str) -> ApiError:
    return ApiError(503, f"the request was aborted: {reason}.", type="server_error", code="request_aborted")
