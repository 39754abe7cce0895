"""Tests of kimi_batch.bench."""
