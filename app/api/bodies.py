"""JSON request bodies validated straight from their bytes, with FastAPI's answers kept.

A FastAPI body parameter is read with `json.loads` and the Python objects are
then validated: two passes and a Python object per JSON value, most of the
API's CPU on a large traffic batch. `read_json_body` hands the bytes to
pydantic's own JSON parser instead (one pass, in Rust). When that refuses the
body, the body is read again FastAPI's way, so every refusal (and every body
only `json.loads` reads, such as one behind a UTF-8 byte-order mark) is
answered exactly as a body parameter would be: the same 400 and 422 problems,
fields and messages. The route documents the body with `openapi.json_body`.
"""

from __future__ import annotations

import email.message
import json
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from .problems import BODY_UNPARSABLE

M = TypeVar("M", bound=BaseModel)

# methods whose body, when one is sent, must be JSON (`middleware.JsonBodies`)
BODY_METHODS = frozenset({"post", "put", "patch", "delete"})


async def read_json_body(request: Request, model: type[M]) -> M:
    """The request body as `model`; raises what FastAPI raises for a body parameter."""
    body = await request.body()
    content_type = request.headers.get("content-type")
    if body and is_json(content_type):
        try:
            return model.model_validate_json(body)
        except ValidationError:
            pass  # FastAPI's way below names the errors
    return _validated_as_fastapi_does(body, content_type, model)


def is_json(content_type: str | None) -> bool:
    """FastAPI's rule: application/json or application/*+json (parameters allowed)."""
    if content_type is None:
        return False  # a body without a type is not read as JSON (strict content type)
    if content_type == "application/json":
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def _validated_as_fastapi_does(body: bytes, content_type: str | None, model: type[M]) -> M:
    """fastapi.routing's body handling for one required model parameter named `body`."""
    if not body:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    value: Any = body
    if is_json(content_type):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", exc.pos),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": exc.msg},
                    }
                ],
                body=exc.doc,
            ) from exc
        except Exception as exc:  # not UTF-8/16/32, as FastAPI answers it
            raise HTTPException(400, BODY_UNPARSABLE) from exc
    try:
        return model.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]
        raise RequestValidationError(errors, body=value) from exc
