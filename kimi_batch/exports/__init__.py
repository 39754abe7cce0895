"""What a trainer reads, under the `kimi-batch export` command (`cli/export.py`): which rows an
export holds (`selection`), each as the conversation the teacher saw (`conversation`), a training
row's shape (`shape`: where reasoning, tool calls, tools and the system turn go), the `kd` rows
(`kd`), the tokenizer their ids belong to (`tokenizer`), the `hf` folder (`hf`), its dataset card
(`card`) and the languages it declares (`language`). No Dagster here. Other packages import from
here, never from the modules."""

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
from kimi_batch.exports.conversation import (
    BuildExamples,
    ExportExample,
    SystemTexts,
    example_builder,
)
from kimi_batch.exports.hf import push_to_hub, write_hf
from kimi_batch.exports.kd import kd_line, kd_record
from kimi_batch.exports.language import DETECTION_NOTE, ScriptCounter
from kimi_batch.exports.selection import (
    ExportQuery,
    PartitionRows,
    read_selection,
    select_partitions,
)
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
    "BuildExamples",
    "CardFigures",
    "CardOptions",
    "DedupFigures",
    "ExportExample",
    "ExportQuery",
    "InputSource",
    "Layout",
    "PartitionRows",
    "ReasoningPlacement",
    "SamplingFigures",
    "ScriptCounter",
    "SystemTexts",
    "SystemTurn",
    "TokenStats",
    "TokenizerIdentity",
    "TrainingOptions",
    "assistant_message",
    "build_card",
    "example_builder",
    "kd_line",
    "kd_record",
    "push_to_hub",
    "quarantine_counts",
    "read_selection",
    "reason_name",
    "select_partitions",
    "system_side_file",
    "tokenizer_identity",
    "trainer_row",
    "write_hf",
]
