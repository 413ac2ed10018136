"""Bad input: the errors every entry point maps to one clean line and exit code 2."""

from __future__ import annotations


class InputError(Exception):
    """Bad user input (a config, a YAML file, a dataset): the message names the file, row and field.

    The CLI turns every one into the same clean message and exit code (`ada_core.cli.INPUT_ERROR_EXIT`).
    """


class DatasetError(InputError, ValueError):
    """A dataset cannot be used; the message names the file, the 1-based row and the field."""


class DatasetMissingError(InputError, FileNotFoundError):
    """A dataset file that does not exist."""
