"""The quality gate (`gate`: what a gated stage's landing keeps, and benchmark contamination:
token n-gram indexes of the benchmark files) and exact and near duplicates across nights
(`dedup_index`: exact keys and MinHash LSH in the state database, and the texts and tokens they
are judged on). Other packages import from here, never from the modules.
"""

from kimi_batch.quality.dedup_index import (
    DedupIndex,
    DedupSetting,
    IndexedText,
    index_entries,
    loose_text,
    normalize_text,
    rescreen_partitions,
    shingles,
)
from kimi_batch.quality.gate import (
    CONTAMINATED,
    DUPLICATE,
    NEAR_DUPLICATE,
    PartitionGate,
    QualityGate,
    set_aside_totals,
)

__all__ = [
    "CONTAMINATED",
    "DUPLICATE",
    "NEAR_DUPLICATE",
    "DedupIndex",
    "DedupSetting",
    "IndexedText",
    "PartitionGate",
    "QualityGate",
    "index_entries",
    "loose_text",
    "normalize_text",
    "rescreen_partitions",
    "set_aside_totals",
    "shingles",
]
