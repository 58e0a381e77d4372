"""A `corpus.id_column` the corpus's header lacks is refused before any shard runs, not silently replaced by row numbers."""

from __future__ import annotations

import json

import pytest

from batch.corpus.plan import require_id_column
from batch.run import driver
from classify.config.batch import CorpusConfig
from classify.errors import InputError
from tests.support import ROOT


def _csv(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("doc,text\na,hello\nb,world\n", encoding="utf-8")
    return path


def test_an_absent_id_column_is_an_input_error_naming_the_header(tmp_path):
    path = _csv(tmp_path)
    with pytest.raises(InputError) as err:
        require_id_column(CorpusConfig(path=str(path), id_column="id"), path, "csv")
    msg = str(err.value)
    assert "'id'" in msg and "['doc', 'text']" in msg and "id_column: null" in msg
    require_id_column(CorpusConfig(path=str(path), id_column="doc"), path, "csv")  # present: fine
    require_id_column(CorpusConfig(path=str(path), id_column=None), path, "csv")  # null: generated ids


def test_an_absent_parquet_id_column_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["x"]}), path)
    with pytest.raises(InputError, match="'doc'"):
        require_id_column(CorpusConfig(path=str(path), id_column="doc"), path, "parquet")


def test_the_batch_refuses_it_before_the_model_is_even_resolved(tmp_path, monkeypatch):
    data = json.loads((ROOT / "config" / "docpilot.json").read_text())
    data["corpus"].update(path=str(_csv(tmp_path)), id_column="id", id_prefix=None)
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps(data))
    monkeypatch.setenv("DOCPILOT_RUNS", str(tmp_path / "runs"))

    def no_model(*a, **k):
        raise AssertionError("the model was resolved before the corpus was checked")

    monkeypatch.setattr(driver, "resolve_model", no_model)
    with pytest.raises(InputError, match="no such column"):
        driver.run_batch(driver.BatchOptions(config=str(config), batch_id="b-idcol"))
