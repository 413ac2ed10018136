"""`python -m report RUN_DIR... --out OUT_DIR [--reference grpo]`: the comparison report, offline."""

from report.writer import main

main()
