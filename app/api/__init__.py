"""The REST API: routers, schemas, auth, problem+json errors."""

from .app import create_app
from .deps import Services

__all__ = ["Services", "create_app"]
