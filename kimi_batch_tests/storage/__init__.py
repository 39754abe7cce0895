"""Tests of kimi_batch.storage."""
