"""`WarehouseResource`: the Parquet warehouse (Hive layout) and the ledger the assets write to."""

from kimi_batch.defs.resources.deployment import DeploymentResource
from kimi_batch.engine import Ledger
from kimi_batch.paths import StatePaths
from kimi_batch.quality import QualityGate
from kimi_batch.storage import Landing
from kimi_batch.warehouse import Warehouse, open_warehouse


class WarehouseResource(DeploymentResource):
    """Where a partition's inputs, finished requests and tables live (`Settings.paths`).

    Locations are deployment configuration (KIMI_BATCH_HOME, KIMI_BATCH_WAREHOUSE), so the
    sensor, the schedule and every run see the same state directory.
    """

    def paths(self) -> StatePaths:
        return self.deployment.paths

    def warehouse(self) -> Warehouse:
        return open_warehouse(self.deployment)

    def ledger(self) -> Ledger:
        return Ledger(self.paths().ledger_state)

    def landing(self) -> Landing:
        return Landing(self.paths())

    def quality_gate(self) -> QualityGate:
        """The gate the quality-gated stages' rows pass as they land (KIMI_BATCH_DEDUP_*,
        KIMI_BATCH_BENCHMARKS)."""
        return QualityGate(self.deployment, self.paths().dedup_state)
