"""Tests of kimi_batch.settings."""
