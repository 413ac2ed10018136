"""Modules that run inside a launched vLLM server's own interpreter (`.venv-vllm`), not in ours.

They import the standard library (and, for the guard, starlette, which vLLM brings) and nothing of
ada_core: the server's PYTHONPATH is this folder alone (ada_core/engines/vllm_server.py).

- `ada_vllm_launch.py`: the server's parent, which ends the server when the process that launched
  it dies, however it dies (its lifeline pipe closes).
- `ada_vllm_guard.py`: ASGI middleware (`--middleware`) that refuses every request without the
  server's API key, the dev endpoints included, which vLLM's own `--api-key` leaves open.
"""
