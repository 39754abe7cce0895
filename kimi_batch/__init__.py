"""kimi_batch: batch inference over a resident CPU llama-server, orchestrated by Dagster."""

__version__ = "0.1.0"
