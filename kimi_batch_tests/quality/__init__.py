"""Tests of kimi_batch.quality."""
