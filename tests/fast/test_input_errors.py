"""Bad input files fail with the file, row and field named."""

from __future__ import annotations

import pytest

from ada_core.config import ConfigError, build_config
from ada_core.data import load_dataset_file
from ada_core.errors import DatasetError


def test_non_utf8_bytes_name_the_file_row_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"problem": "1+1?", "answer": "2"}\n{"problem": "caf\xe9 \xff", "answer": "3"}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl: row 2: field 'problem' is not valid UTF-8 \(byte 0xe9"):
        load_dataset_file(path)


def test_an_empty_dataset_file_says_so(tmp_path):
    for content in ("", "\n\n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(content)
        with pytest.raises(DatasetError, match=r"empty\.jsonl: the file has no rows"):
            load_dataset_file(path)
    path.write_text('{"prompt": "hi", "response": "x"}\n')
    with pytest.raises(DatasetError, match=r"empty\.jsonl: row 1: cannot tell the dataset schema.*problem\+answer"):
        load_dataset_file(path)


def test_yaml_syntax_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("sampler:\n  M: 4\n   n: [1\n")
    with pytest.raises(ConfigError, match=r"cfg\.yaml: line \d+, column \d+: not valid YAML"):
        build_config("grpo", "tiny", config_file=path)
