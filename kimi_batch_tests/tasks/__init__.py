"""Tests of kimi_batch.tasks (pure functions: no server needed)."""
