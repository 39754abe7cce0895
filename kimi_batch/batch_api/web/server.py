"""`kimi-batch api`: resolve who may call (the key, or `--no-auth` on loopback), say so, serve.

The key is `KIMI_BATCH_API_KEY` when set, else the one generated at the first start, like
Jupyter's token: a random one written to `StatePaths.api_key_path` (0600 in a 0700 folder),
whose path is printed. The file is written under a temp name and linked into place, so a second
server starting at the same moment reads the first one's key and never a half-written file.
`--no-auth` is refused unless every address of the bind host is a loopback address, and warned
about at each start.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shlex
import socket
import stat
import sys
from pathlib import Path
from typing import TextIO

import uvicorn

from kimi_batch.batch_api.web.app import create_app
from kimi_batch.batch_api.web.guard import ApiAccess
from kimi_batch.batch_api.web.runs import BatchRuns, RunMode
from kimi_batch.errors import ConfigError
from kimi_batch.paths import PRIVATE_FILE_MODE, private_dir
from kimi_batch.settings import Settings

DEFAULT_HOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def resolve_access(settings: Settings, *, host: str, no_auth: bool = False) -> ApiAccess:
    """The key the server will ask for (generated and kept on first use), or none."""
    allowed = settings.api_allowed_hosts
    if no_auth:
        if not is_loopback(host):
            raise ConfigError(
                f"--no-auth is refused on {host}: without a key anyone who reaches it reads and "
                "deletes every batch; bind 127.0.0.1, or drop --no-auth (a key is made for you)"
            )
        return ApiAccess(key=None, bound_host=host, allowed_hosts=allowed)
    if settings.api_key:
        return ApiAccess(key=settings.api_key, bound_host=host, allowed_hosts=allowed)
    path = settings.paths.api_key_path
    key, _ = load_or_create_key(path)
    return ApiAccess(key=key, bound_host=host, allowed_hosts=allowed, key_file=path)


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def startup_text(access: ApiAccess, url: str) -> str:
    """What the command prints once at start: where it answers and how a client authenticates."""
    lines = [f"kimi-batch api: serving the Batch API at {url}"]
    if access.key is None:
        lines.append(
            "kimi-batch: warning: --no-auth: every user of this machine can list, download and "
            "delete every batch's prompts and answers"
        )
    elif access.key_file is not None:
        quoted = shlex.quote(str(access.key_file))
        lines += [
            f"The API key is in {access.key_file} (readable by you only). Use it with:",
            f"    export OPENAI_API_KEY=$(cat {quoted})",
            f"    export OPENAI_BASE_URL={url}",
        ]
    else:
        lines.append("The API key is KIMI_BATCH_API_KEY (send it as OPENAI_API_KEY).")
    return "\n".join(lines)


def runner_text(mode: RunMode, dagster_home: str) -> str:
    """The banner's line on who runs the batches (checked again every tick: a daemon started
    later takes over, one stopped hands back)."""
    if mode is RunMode.DAEMON:
        return f"Batches are run by the Dagster daemon serving {dagster_home}."
    if mode is RunMode.OWN:
        return (
            f"No Dagster daemon serves {dagster_home}: this process runs the batches itself "
            "(each one a run of api_batch_job there, shown by `make dev`'s UI)."
        )
    return (
        f"kimi-batch: warning: no Dagster daemon serves {dagster_home} and --no-launch is set: "
        "batches wait until one starts (make dev)"
    )


def serve(
    settings: Settings,
    *,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    no_auth: bool = False,
    launch: bool = True,
    out: TextIO = sys.stderr,
) -> None:
    """Run the API until interrupted, starting the batches' runs when no daemon does."""
    access = resolve_access(settings, host=host, no_auth=no_auth)
    port = settings.api_port if port is None else port
    runs = BatchRuns(settings, launch=launch)
    home = str(runs.instance.root_directory)
    print(startup_text(access, base_url(host, port)), file=out, flush=True)
    print(runner_text(runs.mode(), home), file=out, flush=True)
    runs.start()
    try:
        uvicorn.run(create_app(settings, access), host=host, port=port, log_level="warning")
    finally:
        runs.stop()


# 32 random bytes: the strength of an OpenAI key, URL- and shell-safe.
_KEY_BYTES = 32


def load_or_create_key(path: Path) -> tuple[str, bool]:
    """The key stored at `path` and whether this call created it."""
    private_dir(path.parent)
    try:
        return _read_key(path), False
    except FileNotFoundError:
        pass
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(descriptor, "w") as writer:
            writer.write(secrets.token_urlsafe(_KEY_BYTES) + "\n")
        try:
            os.link(temp, path)
        except FileExistsError:
            return _read_key(path), False
    finally:
        temp.unlink(missing_ok=True)
    return _read_key(path), True


def _read_key(path: Path) -> str:
    mode = path.stat().st_mode
    # A key others can read protects nothing: refuse it rather than serve with it.
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path} is readable by other users (mode {stat.S_IMODE(mode):o}): "
            f"run `chmod 600 {path}` or delete it to have a new key made"
        )
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise ConfigError(f"{path} is empty: delete it to have a new key made")
    return key
