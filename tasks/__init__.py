"""Thin Prefect tasks over ada_core: each wraps one call, with retries and caching where safe."""
