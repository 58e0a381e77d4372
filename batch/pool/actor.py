"""Private Ray machinery for ``make batch``: the engine actor and its watchdog, and the clean-up of dead actors.

Each actor builds the one vLLM classifier (:func:`classify.engine.build.build_engine`) once and
classifies whole shards (the scheduler is :func:`batch.pool.scheduler.run_pool`). vLLM's offline ``LLM``
blocks for ever in its output queue when its engine core dies (``SyncMPClient.get_output``), so
the actor watches its ``VLLM::`` child processes and exits itself
(:meth:`EngineActor._watch_engine`), which Ray reports as ``RayActorError``. :func:`reap` stops
engine processes that dead actors left behind on this node.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from batch.corpus.shard import ShardInput, ShardOutput
from batch.pool.local_ray import terminate_then_kill
from classify.config.sections import ClassifyConfig, EngineConfig, ModelConfig
from classify.engine.build import build_engine
from classify.engine.prompt import set_tokenizer_threads
from classify.engine.scoring import AdapterHandle
from classify.errors import EngineError

log = logging.getLogger(__name__)

class EngineActor:
    """One vLLM engine in a Ray actor (wrapped with ``ray.remote`` by :func:`actor_class`).

    Args:
        model_cfg: base model section.
        engine_cfg: engine sizing.
        classify_cfg: categories and prompt settings.
        adapter: the verified adapter handle, or ``None`` for the base model.
        model_fingerprint: the fingerprint the driver resolved; the actor refuses another model.
        temperature: score temperature (the adapter card's ``calibration.temperature``); ``None``
            takes ``adapter.temperature``. Given in merged mode, where ``adapter`` is ``None``.

    Raises:
        EngineError: vLLM cannot start, or the model on this node has another fingerprint.
    """

    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig, classify_cfg: ClassifyConfig,
                 adapter: AdapterHandle | None, model_fingerprint: str, *, temperature: float | None = None):
        set_tokenizer_threads()  # the prompt tokenizer's batch encode runs on this actor's cores
        self.adapter = adapter
        self.temperature = temperature
        self.max_doc_bytes = classify_cfg.max_doc_bytes
        self.clf = build_engine(model_cfg, engine_cfg, classify_cfg, enable_lora=adapter is not None)
        if model_fingerprint and self.clf.model.fingerprint != model_fingerprint:
            raise EngineError(f"model on this node has fingerprint {self.clf.model.fingerprint}, "
                              f"the batch expects {model_fingerprint} ({model_cfg.base_model})")
        self._stopping = False
        threading.Thread(target=self._watch_engine, args=(engine_processes(),), daemon=True,
                         name="docpilot-engine-watchdog").start()

    def _watch_engine(self, procs: list[Any], interval_s: float = 1.0) -> None:
        """End this actor's process as soon as its vLLM engine is dead, so Ray reports the actor lost.

        vLLM's offline engine does not raise when its engine-core process dies: the next (or the
        running) ``generate`` waits for ever on its output queue. Checked every ``interval_s``:
        each ``VLLM::`` child process recorded at start (engine core, workers) still runs, and
        vLLM's own ``engine_dead`` flag is unset.
        """
        import psutil

        resources = getattr(getattr(getattr(self.clf.llm, "llm_engine", None), "engine_core", None), "resources", None)
        while not self._stopping:
            time.sleep(interval_s)
            dead = []
            for proc in procs:
                try:
                    if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                        dead.append(proc.pid)
                except psutil.Error:
                    dead.append(proc.pid)
            if self._stopping:
                return
            if dead or getattr(resources, "engine_dead", False):
                log.error("vLLM engine of this actor is dead (process(es) %s gone); ending the actor so its "
                          "shard is retried on a fresh one", dead or "?")
                os._exit(70)  # noqa: SLF001 - the only way out of a thread blocked inside vLLM

    def info(self) -> dict[str, Any]:
        """Process id, child process ids (the vLLM engine core), node, CPU binding and whether vLLM compiled the
        model (:meth:`classify.engine.build.Classifier.compiled`), for progress, the summary and tests."""
        import psutil
        import ray

        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(),
                "cpu_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"), "compiled": self.clf.compiled(),
                "procs": [{"pid": p.pid, "create_time": p.create_time()} for p in procs]}

    def classify(self, shard: ShardInput) -> ShardOutput:
        """Classify one shard (raw JSONL bytes parsed here, or documents read on the driver): its shard file's bytes and counts.

        Documents that cannot be classified (unreadable, empty, prompt too long) are rejected by
        the scorer before the engine sees them. An engine failure is never a document's reject
        reason: it is raised, and the driver retries the whole shard on a fresh actor.

        Raises:
            EngineError: vLLM failed on this shard.
        """
        docs = shard.documents(self.max_doc_bytes)
        return ShardOutput.of(self.clf.classify(docs, self.adapter, temperature=self.temperature))

    def shutdown(self) -> None:
        """Stop the vLLM engine's worker processes (the watchdog first, so a clean stop is not a death)."""
        self._stopping = True
        self.clf.shutdown()


def engine_processes() -> list[Any]:
    """This process's vLLM children (``VLLM::EngineCore``, ``VLLM::Worker``...), as ``psutil.Process``.

    vLLM names its processes with ``setproctitle`` (``vllm/utils/system_utils.py``,
    ``set_process_title``: ``VLLM::<name>``); other children (compilers, tokenizer pools) may
    come and go and are not watched.
    """
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            title = f"{proc.name()} {' '.join(proc.cmdline())}"
        except psutil.Error:
            continue
        if "VLLM::" in title:
            found.append(proc)
    return found


def reap(actor_infos: list[dict[str, Any]]) -> list[int]:
    """Stop what is left of dead engine actors on this node: the actor and its vLLM engine-core processes.

    vLLM's engine core does not watch its parent, so an actor killed with SIGKILL (or whose
    driver was killed) leaves it running. Only processes recorded by :meth:`EngineActor.info`
    on this host, with the same pid AND start time (no pid reuse), are signalled: SIGTERM,
    then SIGKILL after 10 s.

    Args:
        actor_infos: :meth:`EngineActor.info` results (from ``progress.json``).

    Returns:
        The pids that were signalled.
    """
    import psutil
    import ray

    here = ray.util.get_node_ip_address() if ray.is_initialized() else None
    victims = []
    for info in actor_infos:
        if here is not None and info.get("node") not in (here, None):
            continue
        for rec in info.get("procs", []):
            try:
                proc = psutil.Process(rec["pid"])
                if abs(proc.create_time() - rec["create_time"]) < 0.01 and proc.pid != os.getpid():
                    victims.append(proc)
            except (psutil.Error, KeyError, TypeError):
                continue
    terminate_then_kill(victims, grace_s=10)
    if victims:
        log.warning("stopped %d leftover engine process(es) of dead actors: %s", len(victims), [p.pid for p in victims])
    return [p.pid for p in victims]


def actor_class() -> Any:
    """The ``ray.remote`` version of :class:`EngineActor` (built lazily: importing this module needs no Ray)."""
    import ray

    return ray.remote(max_restarts=0, max_task_retries=0)(EngineActor)
