"""Loader for blockfp8_mc.yaml: the JSONL beside this file, as a DatasetDict with a test split.

A loader (not ``dataset_path: json``) because datasets resolves ``data_files`` against the
working directory, and lm-eval runs from anywhere.
"""

import json
from pathlib import Path

DATA_FILE = Path(__file__).resolve().parent / "blockfp8_mc.jsonl"


def load_docs(**_kwargs):
    import datasets

    rows = [json.loads(line) for line in DATA_FILE.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
