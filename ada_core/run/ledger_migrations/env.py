"""Alembic environment of the prompt ledger. `ada_core.run.ledger.migrate` hands it an open connection.

The version table is `ada_ledger_alembic_version`, not Alembic's default `alembic_version`, so the
ledger can share a database with MLflow (whose own Alembic history uses the default name).
"""

from alembic import context

from ada_core.run.ledger import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
