"""The pipeline: what is generated and how a partition is run, no Dagster.

The stage protocol (`GenerationTask`: its table, its requests from its inputs, its rows from its
results), the stages (amplify, distill, judge, the Batch API's), their rows and quarantine rows,
the one stage registry. Other packages import from here, never from the modules.

The members are imported on first use (`__getattr__`): the input models below (`kimi_batch.tasks`)
build on the row models here while the stages build on the input models, so an eager facade
would be an import cycle.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
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
    from kimi_batch.pipeline.errors import (
        SKIPPED,
        PartitionSkippedError,
    )
    from kimi_batch.pipeline.generation_task import (
        GenerationTask,
        RowReader,
        ScreenedText,
        SeedInputs,
        SetAside,
        generation_columns,
    )
    from kimi_batch.pipeline.judge import (
        DEFAULT_JUDGE_PARAMS,
        JUDGE_STAGE,
        JudgeInputs,
        JudgeTask,
        Verdict,
        judge_prompt,
    )
    from kimi_batch.pipeline.lease import (
        LEASE_TTL_S,
        LEASE_WAIT_S,
        HeldPartition,
        partition_lease,
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
    from kimi_batch.pipeline.registry import (
        STAGES,
        register_stage,
        stage_of_tag,
        unregister_stage,
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
    from kimi_batch.pipeline.tags import (
        AMPLIFY_STAGE,
        DISTILL_STAGE,
        Origin,
        RequestTag,
        Strategy,
    )

# Member -> the module that defines it.
_MODULES: dict[str, str] = {
    "AmplifyTask": "amplify",
    "DEFAULT_AMPLIFY_PARAMS": "amplify",
    "TEMPLATES": "amplify",
    "amplification_requests": "amplify",
    "dedup_variants": "amplify",
    "parse_variant": "amplify",
    "variant_instruction": "amplify",
    "ApiBatchInputs": "api_batch",
    "ApiBatchTask": "api_batch",
    "NOT_JSON_REASON": "api_batch",
    "DEFAULT_DISTILL_PARAMS": "distill",
    "DistillInputs": "distill",
    "DistillTask": "distill",
    "EMPTY_REASON": "distill",
    "SEED_TAG": "distill",
    "TRUNCATED_REASON": "distill",
    "distillation_requests": "distill",
    "parse_tag": "distill",
    "variant_tag": "distill",
    "PartitionSkippedError": "errors",
    "SKIPPED": "errors",
    "GenerationTask": "generation_task",
    "RowReader": "generation_task",
    "ScreenedText": "generation_task",
    "SeedInputs": "generation_task",
    "SetAside": "generation_task",
    "generation_columns": "generation_task",
    "DEFAULT_JUDGE_PARAMS": "judge",
    "JUDGE_STAGE": "judge",
    "JudgeInputs": "judge",
    "JudgeTask": "judge",
    "Verdict": "judge",
    "judge_prompt": "judge",
    "HeldPartition": "lease",
    "LEASE_TTL_S": "lease",
    "LEASE_WAIT_S": "lease",
    "partition_lease": "lease",
    "TEMPLATE_TOKENS_FIXED": "prompt_length",
    "TEMPLATE_TOKENS_PER_TURN": "prompt_length",
    "TOKENIZE_CONCURRENCY": "prompt_length",
    "check_prompt_lengths": "prompt_length",
    "find_overlong": "prompt_length",
    "quarantine_overlong": "prompt_length",
    "template_tokens": "prompt_length",
    "token_bound": "prompt_length",
    "INPUT_STAGE": "quarantine",
    "RAW_LIMIT": "quarantine",
    "failure_rows": "quarantine",
    "file_row": "quarantine",
    "input_row": "quarantine",
    "raw_json": "quarantine",
    "rejected_raw": "quarantine",
    "result_row": "quarantine",
    "set_aside_row": "quarantine",
    "truncate_raw": "quarantine",
    "STAGES": "registry",
    "register_stage": "registry",
    "stage_of_tag": "registry",
    "unregister_stage": "registry",
    "AmplifiedRow": "rows",
    "DistilledRow": "rows",
    "GenerationColumns": "rows",
    "JudgedRow": "rows",
    "OutputRow": "rows",
    "PARTITION_COLUMNS": "rows",
    "QuarantineRow": "rows",
    "SeedMessage": "rows",
    "SeedRow": "rows",
    "ShortAnswer": "schemas",
    "StepByStepAnswer": "schemas",
    "import_output_model": "schemas",
    "CheckFigures": "sink",
    "StageSink": "sink",
    "AMPLIFY_STAGE": "tags",
    "DISTILL_STAGE": "tags",
    "Origin": "tags",
    "RequestTag": "tags",
    "Strategy": "tags",
}
_LAZY_MEMBERS = tuple(_MODULES)
__all__ = [
    "AMPLIFY_STAGE",
    "DEFAULT_AMPLIFY_PARAMS",
    "DEFAULT_DISTILL_PARAMS",
    "DEFAULT_JUDGE_PARAMS",
    "DISTILL_STAGE",
    "EMPTY_REASON",
    "INPUT_STAGE",
    "JUDGE_STAGE",
    "LEASE_TTL_S",
    "LEASE_WAIT_S",
    "NOT_JSON_REASON",
    "PARTITION_COLUMNS",
    "RAW_LIMIT",
    "SEED_TAG",
    "SKIPPED",
    "STAGES",
    "TEMPLATES",
    "TEMPLATE_TOKENS_FIXED",
    "TEMPLATE_TOKENS_PER_TURN",
    "TOKENIZE_CONCURRENCY",
    "TRUNCATED_REASON",
    "AmplifiedRow",
    "AmplifyTask",
    "ApiBatchInputs",
    "ApiBatchTask",
    "CheckFigures",
    "DistillInputs",
    "DistillTask",
    "DistilledRow",
    "GenerationColumns",
    "GenerationTask",
    "HeldPartition",
    "JudgeInputs",
    "JudgeTask",
    "JudgedRow",
    "Origin",
    "OutputRow",
    "PartitionSkippedError",
    "QuarantineRow",
    "RequestTag",
    "RowReader",
    "ScreenedText",
    "SeedInputs",
    "SeedMessage",
    "SeedRow",
    "SetAside",
    "ShortAnswer",
    "StageSink",
    "StepByStepAnswer",
    "Strategy",
    "Verdict",
    "amplification_requests",
    "check_prompt_lengths",
    "dedup_variants",
    "distillation_requests",
    "failure_rows",
    "file_row",
    "find_overlong",
    "generation_columns",
    "import_output_model",
    "input_row",
    "judge_prompt",
    "parse_tag",
    "parse_variant",
    "partition_lease",
    "quarantine_overlong",
    "raw_json",
    "register_stage",
    "rejected_raw",
    "result_row",
    "set_aside_row",
    "stage_of_tag",
    "template_tokens",
    "token_bound",
    "truncate_raw",
    "unregister_stage",
    "variant_instruction",
    "variant_tag",
]


def __getattr__(name: str) -> object:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
