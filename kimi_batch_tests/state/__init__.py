"""Tests of kimi_batch/state/: the state databases shared by several workers."""
