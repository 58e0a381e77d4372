"""The command that resumes a stopped batch, in the user's form (``make batch BATCH=ID CORPUS=...`` or CLI flags).

Said where a batch stops (Ctrl-C, SIGTERM: :func:`batch.run.driver.main`) and by ``docpilot status`` of a batch
that failed or was interrupted. It names what a resume must repeat: the batch id, the config file when it is not
the default (:data:`classify.config.file.DEFAULT_CONFIG`), the corpus when it is not the config's own ``corpus.path``, the adapter, and
``--skip-pilot-gate`` when the batch ran with it.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

from batch.corpus.plan import configured_corpus
from classify.config.batch import CorpusConfig
from classify.config.file import DEFAULT_CONFIG
from classify.usercommand import user_command

log = logging.getLogger("docpilot.batch")


def resume_command(batch_id: str, corpus: str | Path | None = None, adapter: str | None = None,
                   skip_pilot_gate: bool = False, config: str | Path | None = None) -> str:
    """``docpilot batch --batch-id ID [--config F] [--corpus C] [--adapter A] [--skip-pilot-gate]`` in the user's form.

    Args:
        batch_id: the batch.
        corpus: the corpus it ran on, ``None`` for the config's own.
        adapter: the adapter it ran with, ``None`` for none.
        skip_pilot_gate: it ran with ``--skip-pilot-gate``.
        config: the config file it ran with; ``None`` or the default (:data:`DEFAULT_CONFIG`) is not named.
    """
    cli = f"docpilot batch --batch-id {batch_id}"
    if config is not None and not is_default_config(config):
        cli += f" --config {shlex.quote(str(config))}"  # a path with a space stays one word when pasted
    if corpus is not None:
        cli += f" --corpus {shlex.quote(str(corpus))}"
    if adapter:
        cli += f" --adapter {adapter}"
    if skip_pilot_gate:
        cli += " --skip-pilot-gate"
    return user_command(cli)


def corpus_to_name(corpus: str | Path | None, corpus_cfg: Any) -> str | Path | None:
    """``corpus``, or ``None`` when it is the config's own ``corpus.path`` (a resume need not name it).

    Args:
        corpus: the corpus a batch ran on (``--corpus``, or the manifest's ``corpus.path``), or ``None``.
        corpus_cfg: the config's ``corpus`` section (:class:`classify.config.batch.CorpusConfig` or its JSON), or ``None``.

    Returns:
        ``corpus`` when it cannot be told to be the configured one (naming it is always right).
    """
    if corpus is None or corpus_cfg is None:
        return corpus
    try:
        cfg = corpus_cfg if isinstance(corpus_cfg, CorpusConfig) else CorpusConfig.model_validate(corpus_cfg)
        return None if configured_corpus(cfg, corpus) else corpus
    except Exception as err:  # noqa: BLE001 - a hint only: name the corpus rather than fail
        log.debug("cannot compare corpus %s with the configured one: %s", corpus, err)
        return corpus


def is_default_config(config: str | Path) -> bool:
    """Whether ``config`` names :data:`DEFAULT_CONFIG` (as given, or the same file from here)."""
    if Path(config) == Path(DEFAULT_CONFIG):
        return True
    try:
        return Path(config).resolve() == Path(DEFAULT_CONFIG).resolve()
    except OSError:
        return False
