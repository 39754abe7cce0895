"""`kimi-batch api`: the OpenAI-compatible Batch API (`app`) and its server (`serve`)."""

from kimi_batch.api.app import create_app
from kimi_batch.api.server import serve

__all__ = ["create_app", "serve"]
