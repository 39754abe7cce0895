"""Tests of kimi_batch.batch_api.web, the Batch API's HTTP server."""
