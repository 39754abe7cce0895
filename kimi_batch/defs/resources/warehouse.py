"""`WarehouseResource`: the Parquet warehouse root (Hive layout) the assets write to."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field

from kimi_batch.settings import Settings
from kimi_batch.storage import Warehouse

__all__ = ["WarehouseResource"]


class WarehouseResource(dg.ConfigurableResource):
    """The directory holding `<table>/ds=.../source=.../part-0.parquet`."""

    root: str = Field(description="Warehouse root directory.")

    @classmethod
    def from_settings(cls, settings: Settings) -> WarehouseResource:
        return cls(root=str(settings.warehouse_dir))

    def warehouse(self) -> Warehouse:
        return Warehouse(Path(self.root))
