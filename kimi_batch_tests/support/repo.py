"""The repository checkout the tests run from (its dagster.yaml, workspace.yaml, scripts/)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[2]
