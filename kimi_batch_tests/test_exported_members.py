"""The package facades (`kimi_batch.state`, `.llama`, `.engine`, the feature packages...) export
exactly their surface."""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType

import pytest

FACADES = [
    "kimi_batch.llama",
    "kimi_batch.engine",
    "kimi_batch.pipeline",
    "kimi_batch.storage",
    "kimi_batch.state",
    "kimi_batch.warehouse",
    "kimi_batch.inputs",
    "kimi_batch.quality",
    "kimi_batch.batch_api",
    "kimi_batch.batch_api.web",
    "kimi_batch.exports",
]


def _facade(name: str) -> ModuleType:
    return importlib.import_module(name)


@pytest.mark.parametrize("name", FACADES)
def test_all_public_members_are_exported_and_nothing_else(name: str) -> None:
    facade = _facade(name)
    public = {
        member
        for member, value in vars(facade).items()
        if not member.startswith("_") and not inspect.ismodule(value)
    }
    # Members a facade imports on first use (its module `__getattr__`): heavy optional backends.
    public |= set(getattr(facade, "_LAZY_MEMBERS", ()))
    assert len(facade.__all__) == len(set(facade.__all__)), "duplicates in __all__"
    assert set(facade.__all__) == public


@pytest.mark.parametrize("name", FACADES)
def test_every_exported_class_and_function_is_defined_in_the_package(name: str) -> None:
    facade = _facade(name)
    for member in facade.__all__:
        value = getattr(facade, member)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith(f"{name}."), (member, value.__module__)


def test_the_facades_hold_what_the_upper_layers_use() -> None:
    """A few names per layer that the tasks, storage and Dagster layers build on."""
    llama, engine, pipeline, storage, state, warehouse, inputs, quality, batch_api, web, exports = (
        _facade(name) for name in FACADES
    )
    assert {"LlamaClient", "ChatMessage", "TokenLogprob", "LlamaError"} <= set(llama.__all__)
    assert {"BatchEngine", "GenerationRequest", "Ledger", "SlotWarmer"} <= set(engine.__all__)
    assert {"GenerationTask", "StageSink", "QuarantineRow", "STAGES"} <= set(pipeline.__all__)
    assert {"BlobStore", "StorageError", "private_writer"} <= set(storage.__all__)
    assert {"StateDatabase", "connect_state", "read_state", "StateError"} <= set(state.__all__)
    assert {"Warehouse", "PartitionWrite", "open_warehouse", "TrinoReader", "TABLES"} <= set(
        warehouse.__all__
    )
    assert {"SeedPrompt", "InputReader", "scan_inbox", "Landing", "plan_inbox_tick"} <= set(
        inputs.__all__
    )
    assert {"QualityGate", "DedupIndex", "normalize_text"} <= set(quality.__all__)
    assert {"ApiStore", "BatchRequestLine", "validate_batch"} <= set(batch_api.__all__)
    assert {"create_app", "serve"} <= set(web.__all__)
    assert {"ExportQuery", "write_hf", "trainer_row"} <= set(exports.__all__)
