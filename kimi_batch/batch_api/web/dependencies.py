"""What every route of the Batch API shares: the deployment's settings, its store, list pages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, Request

from kimi_batch.batch_api import ApiStore
from kimi_batch.settings import Settings


def settings_of(request: Request) -> Settings:
    """The `Settings` the app was built with."""
    settings: Settings = request.app.state.settings
    return settings


def _store(request: Request) -> Iterator[ApiStore]:
    """The deployment's store, opened for one request (SQLite connections are per thread)."""
    with ApiStore(settings_of(request).paths) as opened:
        yield opened


StoreDep = Annotated[ApiStore, Depends(_store)]


def page(items: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's list object around one page of items."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": more,
    }
