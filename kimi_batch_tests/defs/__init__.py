"""Tests of kimi_batch.defs (the Dagster layer)."""
