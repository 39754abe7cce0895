"""What a trainer reads, beside the `kimi-batch export` command (`cli/export.py`): a training
row's shape (`shape`: where reasoning, tool calls, tools and the system turn go), the `kd` rows
(`kd`), the tokenizer their ids belong to (`tokenizer`), the `hf` dataset card (`card`) and the
languages it declares (`language`). No Dagster here."""

from kimi_batch.exports.card import (
    CardFigures,
    CardOptions,
    DedupFigures,
    InputSource,
    SamplingFigures,
    TokenStats,
    build_card,
    quarantine_counts,
    reason_name,
)
from kimi_batch.exports.kd import kd_line, kd_record
from kimi_batch.exports.language import DETECTION_NOTE, ScriptCounter
from kimi_batch.exports.shape import (
    Layout,
    ReasoningPlacement,
    SystemTurn,
    TrainingOptions,
    assistant_message,
    system_side_file,
    trainer_row,
)
from kimi_batch.exports.tokenizer import TokenizerIdentity, tokenizer_identity

__all__ = [
    "DETECTION_NOTE",
    "CardFigures",
    "CardOptions",
    "DedupFigures",
    "InputSource",
    "Layout",
    "ReasoningPlacement",
    "SamplingFigures",
    "ScriptCounter",
    "SystemTurn",
    "TokenStats",
    "TokenizerIdentity",
    "TrainingOptions",
    "assistant_message",
    "build_card",
    "kd_line",
    "kd_record",
    "quarantine_counts",
    "reason_name",
    "system_side_file",
    "tokenizer_identity",
    "trainer_row",
]
