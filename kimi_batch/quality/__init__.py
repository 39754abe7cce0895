"""The quality gate (`gate`: what a gated stage's landing keeps): benchmark contamination
(`contamination`: token n-gram indexes of the benchmark files), exact and near duplicates across
nights (`dedup_index`: exact keys and MinHash LSH in the state database), judged on the texts and
tokens of `text_keys`. Other packages import from here, never from the modules.
"""

from kimi_batch.quality.dedup_index import (
    DedupIndex,
    DedupSetting,
    IndexedText,
    index_entries,
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
from kimi_batch.quality.text_keys import loose_text, normalize_text

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
