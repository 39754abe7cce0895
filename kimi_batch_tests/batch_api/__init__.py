"""Tests of kimi_batch.batch_api."""
