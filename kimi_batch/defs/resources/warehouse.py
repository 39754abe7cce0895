"""`WarehouseResource`: the Parquet warehouse (Hive layout) and the ledger the assets write to."""

# No `from __future__ import annotations`: Dagster reads the `ResourceDependency` annotation
# of `deployment` when the class is made, and a string would not be one.

import dagster as dg
from pydantic import Field

from kimi_batch.engine import Ledger
from kimi_batch.paths import StatePaths
from kimi_batch.settings import Settings
from kimi_batch.storage import Landing, Warehouse, warehouse_at

__all__ = ["WarehouseResource"]


class WarehouseResource(dg.ConfigurableResource):
    """Where a partition's inputs, finished requests and tables live (`Settings.paths`).

    Locations are deployment configuration (KIMI_BATCH_HOME, KIMI_BATCH_WAREHOUSE), so the
    sensor, the schedule and every run see the same state directory.
    """

    deployment: dg.ResourceDependency[Settings] = Field(
        description="The deployment's settings (KIMI_BATCH_*), built once per process."
    )

    def paths(self) -> StatePaths:
        return self.deployment.paths

    def warehouse(self) -> Warehouse:
        return warehouse_at(self.paths())

    def ledger(self) -> Ledger:
        return Ledger(self.paths().ledger_state)

    def landing(self) -> Landing:
        return Landing(self.paths())
