"""The prompt ledger: one row per (run, step, prompt), and one per run.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger_runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("run_dir", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "prompt_ledger",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("ledger_runs.run_id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("prompt_id", sa.String(255), primary_key=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("positives", sa.Integer, nullable=False),
        sa.Column("rounds", sa.Integer, nullable=False),
        sa.Column("exit_reason", sa.String(32), nullable=False),
        sa.Column("trained", sa.Boolean, nullable=False),
    )
    op.create_index("ix_prompt_ledger_run_prompt", "prompt_ledger", ["run_id", "prompt_id"])


def downgrade() -> None:
    op.drop_index("ix_prompt_ledger_run_prompt", table_name="prompt_ledger")
    op.drop_table("prompt_ledger")
    op.drop_table("ledger_runs")
