"""One long-lived code server: the shipped workspace file points at it, the helper starts it,
the location loads and reloads from it, and nothing outlives the helper."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.remote_origin import GrpcServerCodeLocationOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from kimi_batch_bench.code_server import (
    CODE_SERVER_WORKSPACE,
    LOCATION_NAME,
    PORT_VARIABLE,
    code_server_argv,
    serving_code_location,
)
from kimi_batch_tests.support.processes import processes_naming
from kimi_batch_tests.support.repo import REPO_ROOT

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server


def test_the_code_server_serves_what_the_workspace_file_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PORT_VARIABLE, "4266")

    (origin,) = WorkspaceFileTarget([str(CODE_SERVER_WORKSPACE)]).create_origins()

    assert isinstance(origin, GrpcServerCodeLocationOrigin)
    assert (origin.host, origin.port, origin.location_name) == ("127.0.0.1", 4266, LOCATION_NAME)
    # The server the helper starts serves the module workspace.yaml loads, under the same name.
    (entry,) = yaml.safe_load((REPO_ROOT / "workspace.yaml").read_text())["load_from"]
    argv = code_server_argv()
    assert argv[argv.index("-m") + 1] == entry["python_module"]["module_name"]
    assert argv[argv.index("--location-name") + 1] == entry["python_module"]["location_name"]
    assert argv[argv.index("-h") + 1] == origin.host


@pytest.mark.slow
def test_the_location_loads_and_reloads_from_one_code_server_that_stops_with_the_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIMI_BATCH_", "DAGSTER_"))}
    home = tmp_path / "home"
    env |= {"KIMI_BATCH_HOME": str(home), "KIMI_BATCH_PARTITIONS_START": "2025-01-01"}
    log = tmp_path / "code_server.log"
    with serving_code_location(env, cwd=REPO_ROOT, log=log) as served:
        port = int(served[PORT_VARIABLE])
        monkeypatch.setenv(PORT_VARIABLE, str(port))
        target = WorkspaceFileTarget([str(CODE_SERVER_WORKSPACE)])
        with dg.instance_for_test() as instance, WorkspaceProcessContext(instance, target) as ctx:
            entry = ctx.get_current_workspace().code_location_entries[LOCATION_NAME]
            assert entry.load_error is None, entry.load_error
            assert entry.code_location is not None
            (repository,) = entry.code_location.get_repositories().values()
            assert repository.has_job("nightly_job")
            served_by = entry.version_key  # the server's id
            # The UI's Reload: the server loads the code again (a new server id), same port.
            ctx.reload_code_location(LOCATION_NAME)
            reloaded = ctx.get_current_workspace().code_location_entries[LOCATION_NAME]
            assert reloaded.load_error is None, reloaded.load_error
            assert reloaded.version_key != served_by
        commands = " ".join(processes_naming(home).values())
        assert "code-server start" in commands, commands
        assert "api grpc" in commands, commands
    # The server, the child it served the code from and that child's successor are gone.
    assert processes_naming(home) == {}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
