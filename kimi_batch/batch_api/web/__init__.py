"""`kimi-batch api`: the OpenAI-compatible Batch API (`create_app`), who may call it
(`ApiAccess`, `resolve_access`) and its server (`serve`)."""

from kimi_batch.batch_api.web.app import create_app
from kimi_batch.batch_api.web.guard import ApiAccess
from kimi_batch.batch_api.web.server import resolve_access, serve

__all__ = ["ApiAccess", "create_app", "resolve_access", "serve"]
