"""Tests of kimi_batch_bench."""
