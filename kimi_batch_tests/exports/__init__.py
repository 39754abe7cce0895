"""Tests of kimi_batch.exports."""
