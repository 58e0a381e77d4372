"""A variable that expands to nothing never turns a configured path into another one (issue 40, item 5).

``${UNSET}/etc/hostname`` was ``/etc/hostname``; every neighbour of that (an empty or spaces-only value,
``${VAR:-}``, ``~${VAR}``, a leading part or a whole folder dropped) in every configured path (corpus,
training data, and the registry, exports, model cache, runs and state folders) is refused with one message
naming the variable, the path as written and as expanded, and what to set.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from classify.config.batch import CorpusConfig
from classify.config.training import DataSection
from classify.errors import ConfigError
from classify.paths import expand_path, exports_dir, model_cache_dir, registry_dir, runs_dir, state_dir
from docpilot.cli import main

REFUSED = [
    ("${UNSET}/etc/hostname", "/etc/hostname", "${UNSET} is empty, from unset UNSET with no default",
     "the path would start from the file-system root"),
    ("${EMPTY}/etc/hostname", "/etc/hostname", "${EMPTY} is empty, from EMPTY set but empty, with no default",
     "the path would start from the file-system root"),
    ("${SPACES}/etc/hostname", "  /etc/hostname", "${SPACES} is only spaces ('  '), from SPACES='  '",
     "the path would start from the file-system root"),
    ("${UNSET:-}/etc/hostname", "/etc/hostname", "${UNSET} is empty, from unset UNSET with no default",
     "the path would start from the file-system root"),
    ("${UNSET}${EMPTY}/etc/hostname", "/etc/hostname", "${UNSET} is empty", "the path would start from the file-system root"),
    ("~${UNSET}/data", "~/data", "${UNSET} is empty, from unset UNSET with no default", "`~` would be your home folder"),
    ("${UNSET}hostname", "hostname", "${UNSET} is empty", "the path would lose the part it starts with"),
    ("/srv/${UNSET}/data", "/srv//data", "${UNSET} is empty", "a folder of the path would be left out"),
    ("/srv/${SPACES}/data", "/srv/  /data", "${SPACES} is only spaces", "a folder of the path would be left out"),
    ("data/${EMPTY}", "data/", "${EMPTY} is empty", "a folder of the path would be left out"),
]


@pytest.fixture(autouse=True)
def _variables(monkeypatch):
    monkeypatch.delenv("UNSET", raising=False)
    monkeypatch.setenv("EMPTY", "")
    monkeypatch.setenv("SPACES", "  ")
    monkeypatch.setenv("SET", "/srv/x")


def _message(configured: str, expanded: str, state: str, effect: str) -> str:
    name = re.search(r"\$\{(\w+)", state).group(1)
    return re.escape(f"path {configured!r} would be {expanded!r}: {state}") + ".*" + re.escape(
        f"so {effect}; set {name} to what it stands for, or write a default in the path (${{{name}:-<value>}})")


def _corpus(configured: str) -> Path:
    return CorpusConfig(path=configured).resolved_path()


def _training_data(configured: str) -> Path:
    return DataSection(path=configured).resolved_path()


IN_CONFIG = {"corpus.path": _corpus, "train.data.path": _training_data}
IN_ENV = {"DOCPILOT_REGISTRY": registry_dir, "DOCPILOT_EXPORTS": exports_dir, "DOCPILOT_MODEL_CACHE": model_cache_dir,
          "DOCPILOT_RUNS": runs_dir, "DOCPILOT_HOME": state_dir}


@pytest.mark.parametrize(("configured", "expanded", "state", "effect"), REFUSED)
def test_every_configured_path_refuses_a_variable_that_drops_part_of_it(monkeypatch, configured, expanded, state, effect):
    message = _message(configured, expanded, state, effect)
    with pytest.raises(ConfigError, match=f"^{message}$"):
        expand_path(configured)
    for resolve in IN_CONFIG.values():
        with pytest.raises(ConfigError, match=f"^{message}$"):
            resolve(configured)
    for var, folder in IN_ENV.items():
        monkeypatch.setenv(var, configured)
        with pytest.raises(ConfigError, match=f"^{var}: {message}$"):
            folder()
        monkeypatch.delenv(var)


@pytest.mark.parametrize(("configured", "expanded"), [
    ("s3://${UNSET}/corpus.jsonl", "s3:///corpus.jsonl"),      # the bucket left out
    ("s3://bucket/${EMPTY}/corpus.jsonl", "s3://bucket//corpus.jsonl"),
    ("s3://bucket/${SPACES}", "s3://bucket/  "),
])
def test_a_corpus_url_refuses_a_variable_that_leaves_out_its_bucket_or_a_folder(configured, expanded):
    with pytest.raises(ConfigError, match=rf"^path {re.escape(repr(configured))} would be {re.escape(repr(expanded))}: .*, "
                                          r"so a folder of the path would be left out; set \w+ to what it stands for"):
        CorpusConfig(path=configured).resolved_location()
    assert CorpusConfig(path="s3://bucket/${UNSET:-corpora}/c-${EMPTY}.jsonl").resolved_location() == "s3://bucket/corpora/c-.jsonl"


@pytest.mark.parametrize(("configured", "expected"), [
    ("$UNSET/x", "$UNSET/x"),                   # a bare $ is kept as written: a relative name, never the root
    ("a/${UNSET}-x.csv", "a/-x.csv"),           # inside a name with other text: empty, as in the shell
    ("${UNSET:-../d}/x", "../d/x"),             # a default is used
    ("${EMPTY:-/srv/d}/x", "/srv/d/x"),
    ("${SET}/x", "/srv/x/x"),
    ("/srv/${SET}/x", "/srv/srv/x/x"),
    ("~/${SET}", "~/srv/x"),
])
def test_paths_that_keep_their_shape_still_expand(configured, expected):
    assert expand_path(configured) == Path(expected).expanduser()


@pytest.mark.parametrize("value", [" ", "   "])
def test_a_folder_variable_of_only_spaces_is_refused_naming_it(monkeypatch, value):
    for var, folder in IN_ENV.items():
        monkeypatch.setenv(var, value)
        with pytest.raises(ConfigError, match=rf"^{var}={value!r} is only spaces: unset it \(for .*\) or set it to a folder$"):
            folder()
        monkeypatch.delenv(var)
    with pytest.raises(ConfigError, match=rf"^path {value!r} is only spaces once expanded$"):
        expand_path(value)
    with pytest.raises(ConfigError, match=r"^path '\$\{SPACES\}' is only spaces once expanded \(\$\{SPACES\} is only spaces, "
                                          r"from SPACES='  '; set SPACES to where the data is\)$"):
        _corpus("${SPACES}")


def test_a_folder_variable_expands_like_a_configured_path(monkeypatch, tmp_path):
    monkeypatch.setenv("BASE", str(tmp_path))
    monkeypatch.setenv("DOCPILOT_REGISTRY", "${BASE}/registry")
    assert registry_dir() == tmp_path / "registry"
    monkeypatch.setenv("DOCPILOT_REGISTRY", "${UNSET:-" + str(tmp_path) + "}/reg")
    assert registry_dir() == tmp_path / "reg"
    monkeypatch.setenv("DOCPILOT_REGISTRY", "")  # empty: the default, as before
    assert registry_dir() == state_dir() / "registry"


def test_the_command_exits_2_with_the_message_and_writes_nothing_at_the_root(monkeypatch, capsys):
    monkeypatch.setenv("DOCPILOT_REGISTRY", "${UNSET}/registry")
    assert main(["adapters", "list"]) == 2
    err = capsys.readouterr().err
    assert err == ("error [config]: DOCPILOT_REGISTRY: path '${UNSET}/registry' would be '/registry': ${UNSET} is empty, "
                   "from unset UNSET with no default, so the path would start from the file-system root; set UNSET to what "
                   "it stands for, or write a default in the path (${UNSET:-<value>})\n")
    assert not Path("/registry").exists()
