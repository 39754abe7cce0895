"""Tests of kimi_batch.inputs."""
