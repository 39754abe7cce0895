"""What the tests share, one module per kind of thing; test modules import only from here.

- `cli`: `run_cli` (`kimi-batch` in a child process) and the one-line-error assertion.
- `ports`: `free_port`, the one way a test picks a loopback port.
- `repo`: `REPO_ROOT` and the repository's own config files.
- `llama_server`: the real llama-server + SmolLM2 session fixtures (a pytest plugin) and `make_spec`.
- `engine`: fresh digests, short questions and endpoints for engine tests on a real server.
- `trino`: the real Trino session fixture (a pytest plugin).
- `rows`, `results`: hand-built table rows and engine results for the server-free tests.
- `markers`: the server fixtures that make a test `slow`, and the guard over them.
- `crashing_binary`: executables standing in for a llama-server that dies by a signal or exits.
- `standins`: the real jobs, sensor and schedule over stand-in assets (also a code location).
- `memory_probe`, `partition_memory_probe`: scripts a test runs in a fresh process to measure
  the memory of the input reader and of a whole partition.
- `api_server`: the Batch API app served in a thread (`serving_api`), for the `openai` client.
- `graphql`, `dagster_stack`: a real dagster-webserver + daemon and a client for its GraphQL API.
- `webhook`: `Receiver`, a webhook endpoint on loopback that keeps what the alerts post.
"""
