"""Dataset lineage in MLflow: each run's training and evaluation sets as dataset inputs."""

from __future__ import annotations

import warnings
from pathlib import Path

from mlflow import MlflowClient


def log_dataset_inputs(client: MlflowClient, run_id: str, source: str, splits: dict[str, list],
                       tags: dict[str, str] | None = None) -> dict[str, str]:
    """Log each split (context -> prompts) as an MLflow dataset input; returns context -> digest.

    The Dataset column of the runs table then names what the run trained and evaluated on. Each
    input is the split as a Hugging Face `datasets.Dataset` (schema: id, text, answer, source,
    difficulty), its digest `ada_core.data.prompts_digest` and, as source, the file or generator
    it was drawn from, with that source's digest (`data_digest`, what the curation cache keys on)
    as a tag; `tags` are added to every input (a curated set names the dataset it was curated from).
    A hub dataset (`org/name@<commit>`) is logged as a Hugging Face source with its repo, split and
    commit as the revision (also the `ada.hub_revision` tag).
    """
    import mlflow.data
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource
    from mlflow.entities import DatasetInput, InputTag

    from ada_core.data import data_digest, prompts_digest
    from ada_core.data.hf import prompts_dataset
    from ada_core.data.prompts import hub_dataset

    path = Path(source)
    origin = path / "prompts.jsonl" if path.is_dir() else path
    source_digest = data_digest(source)
    hub_ref = hub_dataset(source)
    hub_tags: dict[str, str] = {}
    if hub_ref is not None:
        from ada_core.data.hub import dataset_files

        found = dataset_files(hub_ref)  # the cached snapshot the run read: no download
        hub_tags = {"ada.hub_revision": found.snapshot.pinned}
    digests, inputs = {}, []
    for context, prompts in splits.items():
        if not prompts:
            continue
        digest = prompts_digest(prompts)
        name = f"{origin.parent.name + '/' + origin.name if origin.is_file() else source}:{context}"
        if hub_ref is not None:
            name = f"{found.snapshot.repo}:{context}"
            mlflow_source = HuggingFaceDatasetSource(path=found.snapshot.repo, config_name=found.config,
                                                     split=found.split, revision=found.snapshot.commit)
        elif origin.is_file():
            mlflow_source = origin.resolve().as_uri()
        else:
            mlflow_source = CodeDatasetSource(tags={"ada.generator": source})
        with warnings.catch_warnings():  # a file:// URI matches two of MLflow's local source types; either is right
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_huggingface(prompts_dataset(prompts, digest), source=mlflow_source, name=name,
                                                   digest=digest)
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags=[
            InputTag("mlflow.data.context", context), InputTag("ada.source_digest", source_digest),
            *(InputTag(k, str(v)) for k, v in {**hub_tags, **(tags or {})}.items()),
        ]))
        digests[context] = digest
    if inputs:
        log_inputs(client, run_id, inputs)
    return digests


def log_inputs(client: MlflowClient, run_id: str, inputs: list, attempts: int = 3) -> None:
    """`client.log_inputs`, again when another run created the same dataset row at the same moment.

    MLflow's store looks a dataset up by (experiment, name, digest) and inserts it when missing, in
    two statements: runs logging one set at once (a compare's children on two workers) can both
    insert, and one fails on the unique key (`dataset_pk`; 3 of 5 rounds of six at once on PostgreSQL
    here). Its transaction is rolled back whole; a second try finds the row and only links it."""
    from mlflow.exceptions import MlflowException

    for attempt in range(1, attempts + 1):
        try:
            client.log_inputs(run_id, datasets=inputs)
            return
        except MlflowException as err:
            text = str(err)
            if attempt == attempts or not ("dataset_pk" in text or "UNIQUE constraint failed: datasets" in text):
                raise
