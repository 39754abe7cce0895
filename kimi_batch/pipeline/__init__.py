"""The pipeline: what is generated and how a partition is run, no Dagster.

The stage protocol (`GenerationTask`: its table, its requests from its inputs, its rows from its
results), the stages (amplify, distill, judge, the Batch API's), their rows and quarantine rows,
the one stage registry, the night's arithmetic (`night`) and what the morning is told of it
(`alerts`, `webhook`). Other packages import from here, never from the modules.

The members are imported on first use (`__getattr__`): the input models (`kimi_batch.inputs`)
build on the row models here while the stages build on the input models, so an eager facade
would be an import cycle.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from kimi_batch.pipeline.alerts import (
        DEFAULT_NIGHT_ENDS,
        TRINO_PROBE_TIMEOUT_S,
        FailedCheck,
        NightReport,
        PartitionRecord,
        PartitionState,
        deliver,
        due_night,
        failure_text,
        night_message,
        trino_problem,
    )
    from kimi_batch.pipeline.amplify import (
        DEFAULT_AMPLIFY_PARAMS,
        TEMPLATES,
        AmplifyTask,
        amplification_requests,
        dedup_variants,
        parse_variant,
        variant_instruction,
    )
    from kimi_batch.pipeline.api_batch import (
        NOT_JSON_REASON,
        ApiBatchInputs,
        ApiBatchTask,
    )
    from kimi_batch.pipeline.batch_controls import (
        CANCEL_POLL_S,
        BatchCancelledError,
        BatchControls,
        unless_cancelled,
    )
    from kimi_batch.pipeline.distill import (
        DEFAULT_DISTILL_PARAMS,
        EMPTY_REASON,
        SEED_TAG,
        TRUNCATED_REASON,
        DistillInputs,
        DistillTask,
        distillation_requests,
        parse_tag,
        variant_tag,
    )
    from kimi_batch.pipeline.driver import (
        DriverRun,
        PartitionResult,
        PipelineStage,
        StagePlan,
        answered_again,
        asked_again,
        drive,
        oldest_first,
        plan_partition,
        sample_scope,
    )
    from kimi_batch.pipeline.errors import (
        SKIPPED,
        PartitionSkippedError,
        StageConfigError,
    )
    from kimi_batch.pipeline.generation_task import (
        GenerationTask,
        RowReader,
        ScreenedText,
        SeedInputs,
        SetAside,
        generation_columns,
    )
    from kimi_batch.pipeline.interrupts import InterruptibleRunner, interruptible_runner
    from kimi_batch.pipeline.judge import (
        DEFAULT_JUDGE_PARAMS,
        JUDGE_STAGE,
        JudgeInputs,
        JudgeTask,
        Verdict,
        judge_prompt,
    )
    from kimi_batch.pipeline.landed import (
        StageWrite,
        consumed_input_sha,
        generation_figures,
        plan_stage,
        screening,
        stage_data_version,
        summary_markdown,
        write_stage,
    )
    from kimi_batch.pipeline.lease import (
        LEASE_TTL_S,
        LEASE_WAIT_S,
        HeldPartition,
        partition_lease,
    )
    from kimi_batch.pipeline.night import (
        WINDOW_GRACE_S,
        BatchPartition,
        known_partitions,
        local_time,
        log_inbox,
        night_ds,
        nightly_partitions,
        partition_parts_of,
        rescreen_due,
        split_partition_key,
        window_end,
    )
    from kimi_batch.pipeline.prompt_length import (
        TEMPLATE_TOKENS_FIXED,
        TEMPLATE_TOKENS_PER_TURN,
        TOKENIZE_CONCURRENCY,
        check_prompt_lengths,
        find_overlong,
        quarantine_overlong,
        template_tokens,
        token_bound,
    )
    from kimi_batch.pipeline.quarantine import (
        INPUT_STAGE,
        RAW_LIMIT,
        failure_rows,
        file_row,
        input_row,
        raw_json,
        rejected_raw,
        result_row,
        set_aside_row,
        truncate_raw,
    )
    from kimi_batch.pipeline.rows import (
        PARTITION_COLUMNS,
        AmplifiedRow,
        DistilledRow,
        GenerationColumns,
        JudgedRow,
        OutputRow,
        QuarantineRow,
        SeedMessage,
        SeedRow,
    )
    from kimi_batch.pipeline.schemas import (
        ShortAnswer,
        StepByStepAnswer,
        import_output_model,
    )
    from kimi_batch.pipeline.sink import (
        CheckFigures,
        StageSink,
    )
    from kimi_batch.pipeline.stages import (
        AMPLIFY,
        DISTILL,
        JUDGE,
        SEED_ASSET,
        SEED_TABLES,
        STAGE_DECLARATIONS,
        STAGES,
        AmplifyConfig,
        DistillConfig,
        JudgeConfig,
        StageConfig,
        StageDeclaration,
        declare_stage,
        night_end,
        nightly_stages,
        stage_of_tag,
        upstream_of,
        withdraw_stage,
    )
    from kimi_batch.pipeline.tags import (
        AMPLIFY_STAGE,
        DISTILL_STAGE,
        Origin,
        RequestTag,
        Strategy,
    )
    from kimi_batch.pipeline.webhook import WebhookResult, post_message

# The modules, in the order a member is looked for: those the input models below build on first,
# so that looking up a row model never imports a stage (which imports the input models).
_MODULES = (
    "rows",
    "tags",
    "quarantine",
    "schemas",
    "errors",
    "generation_task",
    "sink",
    "prompt_length",
    "lease",
    "batch_controls",
    "amplify",
    "distill",
    "judge",
    "api_batch",
    "stages",
    "driver",
    "webhook",
    "alerts",
    "night",
    "interrupts",
    "landed",
)
_ABSENT = object()

__all__ = [
    "AMPLIFY",
    "AMPLIFY_STAGE",
    "CANCEL_POLL_S",
    "DEFAULT_AMPLIFY_PARAMS",
    "DEFAULT_DISTILL_PARAMS",
    "DEFAULT_JUDGE_PARAMS",
    "DEFAULT_NIGHT_ENDS",
    "DISTILL",
    "DISTILL_STAGE",
    "EMPTY_REASON",
    "INPUT_STAGE",
    "JUDGE",
    "JUDGE_STAGE",
    "LEASE_TTL_S",
    "LEASE_WAIT_S",
    "NOT_JSON_REASON",
    "PARTITION_COLUMNS",
    "RAW_LIMIT",
    "SEED_ASSET",
    "SEED_TABLES",
    "SEED_TAG",
    "SKIPPED",
    "STAGES",
    "STAGE_DECLARATIONS",
    "TEMPLATES",
    "TEMPLATE_TOKENS_FIXED",
    "TEMPLATE_TOKENS_PER_TURN",
    "TOKENIZE_CONCURRENCY",
    "TRINO_PROBE_TIMEOUT_S",
    "TRUNCATED_REASON",
    "WINDOW_GRACE_S",
    "AmplifiedRow",
    "AmplifyConfig",
    "AmplifyTask",
    "ApiBatchInputs",
    "ApiBatchTask",
    "BatchCancelledError",
    "BatchControls",
    "BatchPartition",
    "CheckFigures",
    "DistillConfig",
    "DistillInputs",
    "DistillTask",
    "DistilledRow",
    "DriverRun",
    "FailedCheck",
    "GenerationColumns",
    "GenerationTask",
    "HeldPartition",
    "InterruptibleRunner",
    "JudgeConfig",
    "JudgeInputs",
    "JudgeTask",
    "JudgedRow",
    "NightReport",
    "Origin",
    "OutputRow",
    "PartitionRecord",
    "PartitionResult",
    "PartitionSkippedError",
    "PartitionState",
    "PipelineStage",
    "QuarantineRow",
    "RequestTag",
    "RowReader",
    "ScreenedText",
    "SeedInputs",
    "SeedMessage",
    "SeedRow",
    "SetAside",
    "ShortAnswer",
    "StageConfig",
    "StageConfigError",
    "StageDeclaration",
    "StagePlan",
    "StageSink",
    "StageWrite",
    "StepByStepAnswer",
    "Strategy",
    "Verdict",
    "WebhookResult",
    "amplification_requests",
    "answered_again",
    "asked_again",
    "check_prompt_lengths",
    "consumed_input_sha",
    "declare_stage",
    "dedup_variants",
    "deliver",
    "distillation_requests",
    "drive",
    "due_night",
    "failure_rows",
    "failure_text",
    "file_row",
    "find_overlong",
    "generation_columns",
    "generation_figures",
    "import_output_model",
    "input_row",
    "interruptible_runner",
    "judge_prompt",
    "known_partitions",
    "local_time",
    "log_inbox",
    "night_ds",
    "night_end",
    "night_message",
    "nightly_partitions",
    "nightly_stages",
    "oldest_first",
    "parse_tag",
    "parse_variant",
    "partition_lease",
    "partition_parts_of",
    "plan_partition",
    "plan_stage",
    "post_message",
    "quarantine_overlong",
    "raw_json",
    "rejected_raw",
    "rescreen_due",
    "result_row",
    "sample_scope",
    "screening",
    "set_aside_row",
    "split_partition_key",
    "stage_data_version",
    "stage_of_tag",
    "summary_markdown",
    "template_tokens",
    "token_bound",
    "trino_problem",
    "truncate_raw",
    "unless_cancelled",
    "upstream_of",
    "variant_instruction",
    "variant_tag",
    "window_end",
    "withdraw_stage",
    "write_stage",
]
_LAZY_MEMBERS = frozenset(__all__)


def __getattr__(name: str) -> object:
    """A member of the surface, from the first module that has it (imported then)."""
    if name in _LAZY_MEMBERS:
        for module in _MODULES:
            found = getattr(importlib.import_module(f"{__name__}.{module}"), name, _ABSENT)
            if found is not _ABSENT:
                globals()[name] = found
                return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
