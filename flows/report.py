"""Forwarding entry point: the offline report is the top-level `report` package.

    python -m flows.report RUN_DIR... --out OUT_DIR    # the same as `python -m report ...`
"""

from report import *  # noqa: F403 - the names `from flows.report import ...` had
from report import __all__  # noqa: F401
from report.writer import main

if __name__ == "__main__":
    main()
