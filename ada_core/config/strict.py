"""The base of every config section (ada_core/config/schema.py): an unknown field is refused, and so is an
assignment of a wrong value."""

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
