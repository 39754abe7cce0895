"""Training exports' row shapes: where reasoning, tool calls, tools and the system turn go."""

from kimi_batch.exports.shape import (
    Layout,
    ReasoningPlacement,
    SystemTurn,
    TrainingOptions,
    assistant_message,
    system_side_file,
    trainer_row,
)

__all__ = [
    "Layout",
    "ReasoningPlacement",
    "SystemTurn",
    "TrainingOptions",
    "assistant_message",
    "system_side_file",
    "trainer_row",
]
