"""The stages the bench knows by name: read from the pipeline's stage declarations, here only."""

from __future__ import annotations

__all__ = ["night_stage_assets"]


def night_stage_assets() -> tuple[str, ...]:
    """The assets the night generates, in the night's order (the bench lists no stage by hand)."""
    from kimi_batch.pipeline import nightly_stages

    return tuple(declaration.asset for declaration in nightly_stages())
