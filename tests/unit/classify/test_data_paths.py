"""Data paths in the config expand ``${VAR}`` / ``${VAR:-default}``; the demo data set lives only in config/tests/bench (#26)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from classify.config.batch import CorpusConfig, load_batch_config
from classify.config.sections import load_config
from classify.config.training import DataSection, OutputSection, TrainConfig
from classify.errors import ConfigError, InputError
from classify.paths import expand_path, path_hint, path_variables

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "config" / "docpilot.json"
PRODUCT = ("classify", "batch", "adapters", "serve", "docpilot")


@pytest.mark.parametrize(("configured", "env", "expected"), [
    ("${D:-../data}/test.csv", {}, "../data/test.csv"),
    ("${D:-../data}/test.csv", {"D": "/srv/x"}, "/srv/x/test.csv"),
    ("${D:-../data}/test.csv", {"D": ""}, "../data/test.csv"),  # the shell's :- also takes the default when empty
    ("${D}/test.csv", {"D": "/srv/x"}, "/srv/x/test.csv"),
    ("/a/${D}-${E:-e}.csv", {"D": "d"}, "/a/d-e.csv"),
    ("plain/path.csv", {"D": "/srv/x"}, "plain/path.csv"),
    ("$D/cost$.csv", {"D": "/srv/x"}, "$D/cost$.csv"),  # only ${...} is a variable
])
def test_expand_path_follows_the_shell(monkeypatch, configured, env, expected):
    for name in ("D", "E"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert expand_path(configured) == Path(expected)


@pytest.mark.parametrize("configured", ["${D}", "${D}${E}", "${D:-}"])
def test_a_path_empty_once_expanded_is_refused_not_the_current_directory(monkeypatch, configured):
    monkeypatch.delenv("D", raising=False)
    monkeypatch.setenv("E", "")
    with pytest.raises(ConfigError, match=r"is empty once expanded \(\$\{D\} is empty, from unset D with no default"):
        expand_path(configured)


def test_expand_path_expands_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("D", raising=False)
    assert expand_path("${D:-~/data}/t.csv") == tmp_path / "data" / "t.csv"


@pytest.mark.parametrize(("configured", "at"), [
    ("${D/test.csv", 1),            # unclosed
    ("data/${}/t.csv", 6),          # no name
    ("${1D}/t.csv", 1),             # a name starting with a digit
    ("${D:?unset}/t.csv", 1),       # another operator
    ("${D-x}/t.csv", 1),
    ("${D:-${E:-x}}/t.csv", 1),     # nested
    ("ok/${D}/then ${", 14),        # the second one
])
def test_a_malformed_variable_is_named_with_its_character(configured, at):
    with pytest.raises(ValueError, match=rf"has a malformed `\$\{{` at character {at}: write \$\{{VAR\}} or \$\{{VAR:-default\}}"):
        path_variables(configured)
    with pytest.raises(ConfigError, match=rf"^path {re.escape(repr(configured))} has a malformed `\$\{{` at character {at}"):
        expand_path(configured)


def test_a_malformed_variable_in_the_config_file_is_a_config_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"`corpus.path` has a malformed `\$\{` at character 1: .*, got \"\$\{DATA/c.jsonl\""):
        load_batch_config(SHIPPED, {"corpus.path": "${DATA/c.jsonl"})
    with pytest.raises(ConfigError, match=r"`train.data.path` has a malformed `\$\{` at character 3"):
        load_config(TrainConfig, SHIPPED, {"data.path": "a/${X:=b}/t.csv"})


def test_hint_names_each_variable_and_where_its_value_came_from(monkeypatch):
    monkeypatch.delenv("D", raising=False)
    monkeypatch.delenv("E", raising=False)
    assert path_hint("/plain/t.csv") == ""
    assert path_hint("${broken") == ""
    assert path_hint("${D:-../data}/t.csv") == (" (${D} is ../data, from unset D: ../data from the current directory; "
                                                "set D to where the data is)")
    assert path_hint("${D:-/srv/data}/t.csv") == " (${D} is /srv/data, from unset D: /srv/data; set D to where the data is)"
    assert path_hint("${D}/t.csv") == " (${D} is empty, from unset D with no default; set D to where the data is)"
    monkeypatch.setenv("D", "/x")
    assert path_hint("${D}/${E}/t.csv") == (" (${D} is /x, from D=/x; ${E} is empty, from unset E with no default; "
                                            "set D / E to where the data is)")


def test_a_variable_set_but_empty_is_worded_so_and_its_default_is_used(monkeypatch):
    """As in the shell, ``${D:-x}`` is x when D is unset or empty; the hint tells the two apart."""
    monkeypatch.setenv("D", "")
    assert expand_path("${D:-../data}/t.csv") == Path("../data/t.csv")
    with pytest.raises(ConfigError, match=r"^path '\$\{D\}/t.csv' would be '/t.csv': \$\{D\} is empty, from D set but empty, "):
        expand_path("${D}/t.csv")  # was /t.csv, from the file-system root
    assert path_hint("${D:-../data}/t.csv") == (" (${D} is ../data, from D set but empty: ../data from the current "
                                                "directory; set D to where the data is)")
    assert path_hint("${D}/t.csv") == " (${D} is empty, from D set but empty, with no default; set D to where the data is)"


def test_a_bare_dollar_variable_is_kept_literally_and_the_not_found_hint_says_so(monkeypatch):
    """``$VAR`` without braces is not expanded (a ``$`` may be in a real name); a missing path says to write ``${VAR}``."""
    monkeypatch.setenv("DATA", "/srv/data")
    monkeypatch.delenv("D", raising=False)
    assert expand_path("$DATA/t.csv") == Path("$DATA/t.csv")
    assert path_hint("$DATA/t.csv") == (" ($DATA is taken literally: only ${VAR} and ${VAR:-default} are expanded; "
                                        "write ${DATA})")
    assert path_hint("${D:-/x}/$A/$B/$A.csv") == (" (${D} is /x, from unset D: /x; set D to where the data is) ($A and $B are "
                                                  "taken literally: only ${VAR} and ${VAR:-default} are expanded; "
                                                  "write ${A} and ${B})")
    assert path_hint("/price$5/t.csv") == path_hint("/a$/t.csv") == ""  # no name after the `$`: nothing to hint


def test_a_missing_training_file_with_a_bare_variable_names_the_form_to_write(monkeypatch, tmp_path):
    from adapters.train.data import load_rows

    monkeypatch.chdir(tmp_path)
    cfg = load_config(TrainConfig, SHIPPED, {"data.path": "$DATA/train.csv"})
    with pytest.raises(InputError, match=r"training data \S*\$DATA/train.csv does not exist .*\(\$DATA is taken literally: "
                                         r"only \$\{VAR\} and \$\{VAR:-default\} are expanded; write \$\{DATA\}\)$"):
        load_rows(cfg.data, cfg.classify.categories)


def test_a_corpus_under_an_unset_variable_is_refused_naming_it_then_found_once_set(monkeypatch, tmp_path):
    from batch.corpus.plan import locate_corpus

    monkeypatch.delenv("MY_CORPUS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = CorpusConfig(path="${MY_CORPUS_DIR}/c.jsonl")
    # was "corpus /c.jsonl does not exist" (and a /c.jsonl that existed was read as the corpus)
    with pytest.raises(ConfigError, match=r"^path '\$\{MY_CORPUS_DIR\}/c.jsonl' would be '/c.jsonl': \$\{MY_CORPUS_DIR\} is "
                                          r"empty, from unset MY_CORPUS_DIR with no default, so the path would start from "
                                          r"the file-system root; set MY_CORPUS_DIR to what it stands for, or write a default "
                                          r"in the path \(\$\{MY_CORPUS_DIR:-<value>\}\)$"):
        locate_corpus(cfg)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "c.jsonl").write_text('{"id": "a", "text": "hi"}\n', encoding="utf-8")
    monkeypatch.setenv("MY_CORPUS_DIR", str(tmp_path / "here"))
    assert locate_corpus(cfg) == ((tmp_path / "here" / "c.jsonl").resolve(), "jsonl")


def test_no_data_set_by_default():
    assert CorpusConfig().path is None and CorpusConfig().id_prefix is None
    with pytest.raises(InputError, match=r"^no corpus: set `corpus.path` in the config or pass --corpus PATH$"):
        CorpusConfig().resolved_path()
    assert DataSection().path is None
    with pytest.raises(InputError, match=r"^no training data: set `train.data.path` in the config file$"):
        DataSection().resolved_path()
    assert OutputSection().adapter_name == "adapter"


def test_the_shipped_config_keeps_the_demo_paths(monkeypatch, tmp_path):
    batch = load_batch_config(SHIPPED)
    train = load_config(TrainConfig, SHIPPED)
    assert batch.corpus.path == "${DOCPILOT_BBC_DIR:-../shared/data/bbc-news}/test.csv"
    assert batch.corpus.id_prefix == "bbc-test"
    assert train.data.path == "${DOCPILOT_BBC_DIR:-../shared/data/bbc-news}/train.csv"
    assert train.output.adapter_name == "bbc-news"
    monkeypatch.setenv("DOCPILOT_BBC_DIR", str(tmp_path))
    assert batch.corpus.resolved_path() == tmp_path / "test.csv"
    assert train.data.resolved_path() == tmp_path / "train.csv"
    monkeypatch.delenv("DOCPILOT_BBC_DIR")
    assert batch.corpus.resolved_path() == Path("../shared/data/bbc-news/test.csv")


def test_product_code_names_no_demo_data_set():
    """No "bbc" (any case) anywhere in the product's packages: the demo data set is config, tests and bench only."""
    hits = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".so"):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if "bbc" in line.lower():
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "the demo data set named in product code:\n" + "\n".join(hits)
