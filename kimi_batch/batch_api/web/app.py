"""The OpenAI-compatible Batch API: `/v1/files` and `/v1/batches` over the pipeline.

`create_app` wires the two routers (`files`, `batches`) behind the `Guard` (Host allow-list, no
CORS, the bearer key: `guard.py`), which covers every path, `/openapi.json` included. There is
no `/docs` page: it would load its scripts from a CDN and could not send the key. Creating a
batch records it `validating` and returns; the app's `BatchValidator` (worker threads) validates
and lands it, and resumes at start what a killed API process left `validating`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from kimi_batch.batch_api import BatchValidator
from kimi_batch.batch_api.web.batches import BatchCreate
from kimi_batch.batch_api.web.batches import router as batches_router
from kimi_batch.batch_api.web.errors import install_error_handlers
from kimi_batch.batch_api.web.files import router as files_router
from kimi_batch.batch_api.web.guard import ApiAccess, Guard
from kimi_batch.settings import Settings


def create_app(settings: Settings, access: ApiAccess) -> FastAPI:
    """The app for one deployment (its state dir and limits), answering as `access` allows."""
    app = FastAPI(title="kimi_batch Batch API", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.state.settings = settings
    # Validation runs in worker threads, off the event loop; what a killed API process left
    # validating resumes now.
    app.state.validator = BatchValidator(settings)
    app.state.validator.resume()
    app.include_router(files_router)
    app.include_router(batches_router)
    app.add_middleware(Guard, access=access)
    app.openapi = lambda: _openapi(app)
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the create body, which a dependency reads (bounded) instead of
    FastAPI, so FastAPI does not list it itself."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["BatchCreate"] = BatchCreate.model_json_schema()
        app.openapi_schema = schema
    return app.openapi_schema
