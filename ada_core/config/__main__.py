"""`python -m ada_core.config > docs/CONFIG.md`: the generated config reference (ada_core/config/applies.py)."""

from ada_core.config.applies import config_table
from ada_core.config.schema import TrainConfig

print(config_table(TrainConfig), end="")
