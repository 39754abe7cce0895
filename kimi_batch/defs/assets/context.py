"""What every generation step's helpers read of its context, and the pool they run in."""

from __future__ import annotations

import dagster as dg

__all__ = ["LLAMA_POOL", "RunContext"]

# An asset's step (one partition) or the nightly op's (many): what the helpers read of it.
RunContext = dg.AssetExecutionContext | dg.OpExecutionContext

# The Dagster pool of every step that sends requests to the server (dagster.yaml: limit 1).
LLAMA_POOL = "llama_server"
