"""Alembic migrations of the prompt ledger's schema (ada_core/run/ledger.py runs them; see env.py)."""
