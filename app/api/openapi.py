"""The OpenAPI document and the docs pages: a contract a client can be generated from.

FastAPI writes the paths, schemas and the bearer security scheme (`deps.BEARER`;
each operation's requirement lists the scopes it admits) from the routes; this
module adds problem+json as the media type of every error status an operation
can answer (read from what it takes: a body, parameters, a token, a job id, the
database), the scope in each description, and the request examples. The docs pages load their
assets from this server (the `fastapi-offline` package ships them), so `/docs`
works without the internet.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.models import Schema
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.staticfiles import StaticFiles

from .bodies import BODY_METHODS
from .problems import PROBLEM_JSON

ASSETS = "/docs/assets"

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Problem",
    "description": "RFC 9457 problem details; some problems carry more members "
    "(`job` on a job-state conflict, `reasons` on never-fits and out-of-memory, `checks` "
    "on not-ready)",
    "properties": {
        "type": {"type": "string", "description": "a URI naming the kind of problem"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "description": "offending fields of a validation problem",
            "items": {
                "type": "object",
                "properties": {
                    "field": {"type": "string", "example": "body.parallelism.dp"},
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                },
            },
        },
    },
    "required": ["type", "title", "status", "detail"],
    "additionalProperties": True,
}

# What each error status means when a route does not say more.
DEFAULT_ERRORS = {
    400: "the body is not valid JSON",
    401: "no valid bearer token (only when the server has LIGHTPATH_API_TOKENS)",
    403: "the token's scope does not allow this call",
    404: "no such job",
    413: "the body exceeds LIGHTPATH_MAX_BODY_BYTES",
    415: "a body was sent with a Content-Type other than application/json",
    422: "invalid path, query or body fields (`errors` lists them)",
    503: "the database is busy or unreachable; nothing was done: retry after `Retry-After` seconds",
}
# Operations that never touch the database (so never answer its 503), by tag.
IN_MEMORY_TAGS = {"advice"}


# Request bodies routes read themselves (`bodies.read_json_body`), by schema name
_JSON_BODIES: dict[str, type[BaseModel]] = {}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` of a route that reads its JSON body itself: documented as FastAPI
    documents a required body parameter of type `model` (a component schema)."""
    _JSON_BODIES[model.__name__] = model
    return {
        "requestBody": {
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
            "required": True,
        }
    }


def _add_body_schemas(schemas: dict[str, Any]) -> None:
    """The component schemas of `json_body` models (and the models they use)."""
    if not _JSON_BODIES:
        return
    _, top = models_json_schema(
        [(m, "validation") for m in _JSON_BODIES.values()],
        ref_template="#/components/schemas/{model}",
    )
    for name, schema in top.get("$defs", {}).items():
        # through the document's own model, as get_openapi writes every schema (numbers
        # typed as numbers, no null members)
        schemas.setdefault(
            name,
            jsonable_encoder(Schema.model_validate(schema), by_alias=True, exclude_none=True),
        )


def _problem_content() -> dict[str, Any]:
    return {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}


def _error_statuses(path: str, method: str, op: dict[str, Any]) -> set[int]:
    """The error statuses an operation can answer, read from what it takes."""
    statuses: set[int] = set()
    if "requestBody" in op:
        statuses |= {400, 413, 422}
    if method in BODY_METHODS:
        statuses.add(415)  # `middleware.JsonBodies`: any body it is sent must be JSON
    if op.get("parameters"):
        statuses.add(422)
    for requirement in op.get("security", ()):
        statuses.add(401)
        if any(requirement.values()):  # scopes listed: another scope's token is refused
            statuses.add(403)
    if "{job_id}" in path:
        statuses.add(404)
    if path.startswith("/v1/") and not IN_MEMORY_TAGS & set(op.get("tags", ())):
        statuses.add(503)
    return statuses


def _document_operation(
    path: str, method: str, op: dict[str, Any], schemas: dict[str, Any]
) -> None:
    responses: dict[str, Any] = op.setdefault("responses", {})
    for code in _error_statuses(path, method, op):
        responses.setdefault(str(code), {"description": DEFAULT_ERRORS[code]})
        if code == 503:
            responses[str(code)].setdefault("headers", {})["Retry-After"] = {
                "description": "seconds to wait before retrying",
                "schema": {"type": "integer"},
            }
    for status, response in responses.items():
        if str(status).isdigit() and int(status) >= 400:
            response["content"] = _problem_content()
    for requirement in op.get("security", ()):
        scopes = [s for listed in requirement.values() for s in listed]
        needs = " or ".join(scopes) if scopes else "any"
        note = f"Token scope: {needs} (an operator token may call anything)."
        op["description"] = (op.get("description", "").rstrip() + "\n\n" + note).strip()
    body = op.get("requestBody", {}).get("content", {}).get("application/json")
    if body is not None:
        schema = body.get("schema", {})
        # an optional body (fail's) is anyOf [the model, null]
        refs = [schema.get("$ref", "")] + [s.get("$ref", "") for s in schema.get("anyOf", ())]
        ref = max(refs, key=len)
        examples = schemas.get(ref.rsplit("/", 1)[-1], {}).get("examples")
        if examples:
            body["example"] = examples[0]


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The whole document (see the module doc)."""
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
    )
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    _add_body_schemas(schemas)
    # errors are problem+json, never FastAPI's default validation body
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            _document_operation(path, method, op, schemas)
    return schema


def install_openapi_and_docs(app: FastAPI) -> None:
    """`/openapi.json`, `/docs` (Swagger UI) and `/redoc`, with assets served from here."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    static = files("fastapi_offline") / "static"
    app.mount(ASSETS, StaticFiles(directory=str(static)), name="docs-assets")

    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            swagger_ui_parameters={"persistAuthorization": True},
        )

    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title=f"{app.title} API",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )

    app.add_api_route("/docs", swagger_ui, include_in_schema=False)
    app.add_api_route("/redoc", redoc, include_in_schema=False)
