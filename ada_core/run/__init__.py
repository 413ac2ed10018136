"""The run folder: what a run leaves on disk, and who may write it.

- `files`: the folder's file names and their readers (metrics, generations, run info, result).
- `folder`: claiming a folder (one live writer, holding its lock; a second run into a used folder is
  refused; `--overwrite` moves it aside).
- `resume`: a resume is the same run: the run's own config, and the short list of fields that may change.
- `checkpoints`: sha256 manifests, verification on resume, fallback and pruning.
- `reference`: a KL run's initial weights, kept in the run folder so a resume finds them.
- `ledger`: the prompt ledger in SQL (SQLite or PostgreSQL), one row per (step, prompt).

Modules are imported by name: `ledger` loads SQLAlchemy and Alembic.
"""

__all__ = ["checkpoints", "files", "folder", "ledger", "reference", "resume"]
