"""Tests of kimi_batch.pipeline (the stages and their protocol: no server needed)."""
