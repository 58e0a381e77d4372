"""Mixed-adapter traffic on the real async engine: every answer equals the same request sent alone.

vLLM's CPU LoRA kernels (``vllm/lora/ops/torch_ops/lora_ops.py``) pick each token's adapter
weights with ``lora_b_weights[lora_indices]``; a base-model token has index ``-1``, which Python
indexing turns into the LAST adapter slot. So in an engine step that also holds an adapter
request, base-model tokens were computed with whatever adapter sits in the last slot (loaded
or evicted earlier: slots are not zeroed on eviction). :class:`serve.engine.AsyncClassifier`
therefore never lets base-model and adapter requests share an engine step. This test serves
three adapters on an engine with two LoRA slots, uses each once, then sends base and adapter
requests concurrently in every combination.
"""

from __future__ import annotations

import asyncio

import pytest

from batch.corpus.tabular import iter_csv
from classify.documents.read import document_from_text
from tests.support.answers import score_tolerance
from tests.support.servers import make_tiny_lora

pytestmark = pytest.mark.timeout(1200)  # the module's server may take up to START_TIMEOUT_S (600 s) to start


N_DOCS = 6


@pytest.fixture(scope="module")
def mixed(pilot_config, tmp_path_factory, bbc_dir):
    """An async engine with ``max_loras=2``, three adapters and six BBC test articles."""
    from classify.engine.scoring import AdapterHandle
    from classify.model.model import resolve_model
    from serve.engine import build_async_engine

    model = resolve_model(pilot_config.model)
    handles = [AdapterHandle(f"mix-{i}@1", str(make_tiny_lora(model.path, tmp_path_factory.mktemp(f"mix{i}"), 10 + i)), 100 + i)
               for i in range(3)]
    engine_cfg = pilot_config.engine.model_copy(update={"max_loras": 2})
    clf = build_async_engine(model, pilot_config.model, engine_cfg, pilot_config.classify, enable_lora=True)
    rows = list(iter_csv(bbc_dir / "test.csv", 200_000, id_column=None, id_prefix="bbc-test"))
    docs = [document_from_text(d.id, d.text, 200_000, "bbc") for d, _ in rows[:N_DOCS]]
    loop = asyncio.new_event_loop()
    yield clf, handles, docs, loop

    async def stop():  # inside the running loop, so vLLM's output-handler task really ends and closes its socket
        clf.shutdown()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    loop.run_until_complete(stop())
    loop.close()


def _answers(results):
    return [(r.id, r.category, r.score) for r in results]


def _same(got, want, what, tolerance):
    assert [g[:2] for g in got] == [w[:2] for w in want], what
    for g, w in zip(got, want, strict=True):
        assert g[2] == pytest.approx(w[2], abs=tolerance), what


@pytest.mark.slow  # about 50 s (make test-slow); test_serve_http's base-and-adapter-at-once test stays in make test
def test_concurrent_base_and_adapter_requests_equal_each_request_alone(mixed, pilot_config):
    clf, handles, docs, loop = mixed
    refs = [None, *handles]
    alone = {}
    for ref in refs:  # sequential: each request alone in the engine (also loads each adapter once: 3 > 2 slots)
        alone[ref] = _answers(loop.run_until_complete(clf.classify(docs, ref)))
    assert len({tuple(a) for a in alone.values()}) > 1, "the random adapters should change some answers"
    combos = [(None, handles[0]), (None, handles[1]), (None, handles[2]), (handles[2], None, handles[0]),
              tuple(refs), (None, None, handles[1])]
    for combo in combos:
        async def together(combo=combo):
            return await asyncio.gather(*(clf.classify(docs, ref) for ref in combo))

        for ref, got in zip(combo, loop.run_until_complete(together()), strict=True):
            _same(_answers(got), alone[ref], f"{ref.name if ref else 'base'} sent with {[r and r.name for r in combo]}",
                  score_tolerance(pilot_config.model))


def test_phase_gate_never_admits_both_groups_and_serves_waiters_in_order():
    from serve.engine import PhaseGate

    async def scenario():
        gate, log, running = PhaseGate(), [], set()

        async def request(name, group, hold_s):
            await gate.acquire(group)
            running.add(group)
            assert running == {group}, f"{name} admitted while {running} run"
            log.append(name)
            await asyncio.sleep(hold_s)
            running.discard(group) if gate.active[1] == 1 else None
            gate.release()

        tasks = [asyncio.create_task(request("base-1", "base", 0.05)),
                 asyncio.create_task(request("base-2", "base", 0.05))]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(request("lora-1", "lora", 0.05)))
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(request("base-3", "base", 0.01)))  # queues behind lora-1: no starvation
        cancelled = asyncio.create_task(request("lora-cancelled", "lora", 0.01))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        await asyncio.gather(*tasks)
        return log, gate.active

    log, active = asyncio.run(scenario())
    assert log == ["base-1", "base-2", "lora-1", "base-3"]
    assert active == (None, 0)


@pytest.fixture(scope="module")
def registry_pair(mixed, pilot_config, tmp_path_factory):
    """A private registry with ``tamper-a@1`` and ``tamper-b@1`` (random LoRAs) and a same-shape stranger's weights."""
    from adapters.registry.registry import Registry
    from classify.model.model import resolve_model

    model = resolve_model(pilot_config.model)
    reg = Registry(tmp_path_factory.mktemp("tamper-registry"))
    card = {"base_model": {"name": model.name, "fingerprint": model.fingerprint}, "training": {"kind": "random-init test"}}
    for name, seed in (("tamper-a", 21), ("tamper-b", 22)):
        reg.publish(make_tiny_lora(model.path, tmp_path_factory.mktemp(name), seed), name, 1, card)
    stranger = make_tiny_lora(model.path, tmp_path_factory.mktemp("stranger"), 23) / "adapter_model.safetensors"
    return reg, model, stranger


def _service(reg, model, pilot_config):
    from serve.adapters import AdapterService

    return AdapterService(reg, model, pilot_config.model, pilot_config.classify, skip_pilot_gate=True,
                          engine_cfg=pilot_config.engine.model_copy(update={"max_loras": 2}))


@pytest.mark.slow  # about 75 s (make test-slow); tests/unit/serve's registry checks and the served paths below stay in make test
def test_registry_bytes_replaced_or_truncated_after_first_use_are_never_served(mixed, registry_pair, pilot_config):
    """Serve an adapter, tamper with its registry file, make vLLM evict it and load it again: the verified bytes answer.

    On main vLLM was given the registry path: after the eviction it re-read the replaced weights and served
    them under the verified name and sha256 (200), and a truncated file took the engine down for everyone.
    """
    from classify.engine.scoring import AdapterHandle
    from classify.errors import AdapterIntegrityError

    clf, handles, docs, loop = mixed
    # an unmerged LoRA costs ~3 s a 256-token document on the 2-core CPU engine and every answer below is computed
    # afresh (the prefix cache is emptied each round): three article openings, about 130 tokens each
    docs = [document_from_text(d.id, d.text[:600], 200_000, "bbc") for d in docs[:3]]
    reg, model, stranger = registry_pair
    tolerance = score_tolerance(pilot_config.model)
    service = _service(reg, model, pilot_config)
    try:
        first = {}
        for ref in ("tamper-a@1", "tamper-b@1"):
            served = service.resolve(ref)
            assert served.handle().path.startswith(str(service._root()))  # vLLM reads the private copy
            first[ref] = (served.sha256, _answers(loop.run_until_complete(clf.classify(docs, served.handle()))))
        weights = reg.show("tamper-a@1").path / "adapter_model.safetensors"
        assert weights.stat().st_size == stranger.stat().st_size
        weights.write_bytes(stranger.read_bytes())  # replaced in place, same size
        truncated = reg.show("tamper-b@1").path / "adapter_model.safetensors"
        truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
        # what the replaced bytes answer (loaded under a fresh id): different, so serving them would show
        wrong = _answers(loop.run_until_complete(clf.classify(docs, AdapterHandle("tampered", str(weights.parent), 999))))
        assert [w[:2] for w in wrong] != [f[:2] for f in first["tamper-a@1"][1]] or any(
            abs(w[2] - f[2]) > tolerance for w, f in zip(wrong, first["tamper-a@1"][1], strict=True))
        for round_ in range(2):  # three other adapters through two slots: both tamper-* are evicted and reloaded
            for handle in handles:
                loop.run_until_complete(clf.classify(docs[:1], handle))
            # vLLM's prefix cache keys blocks by adapter name and path, both unchanged here: emptied, every
            # token of the answer below is computed with the weights loaded now, not reused from the first use
            assert loop.run_until_complete(clf.llm.reset_prefix_cache())
            for ref in ("tamper-a@1", "tamper-b@1"):
                served = service.resolve(ref)  # the same server: the verified copy, the same identity
                got = _answers(loop.run_until_complete(clf.classify(docs, served.handle())))
                assert served.sha256 == first[ref][0]
                _same(got, first[ref][1], f"{ref} after tampering, round {round_}", tolerance)
        assert not clf.llm.errored  # the truncated file never reached the engine
        fresh = _service(reg, model, pilot_config)  # a server started after the tampering refuses both, naming the file
        try:
            for ref in ("tamper-a@1", "tamper-b@1"):
                with pytest.raises(AdapterIntegrityError, match=r"adapter_model\.safetensors: sha256") as err:
                    fresh.resolve(ref)
                assert err.value.http_status == 409 and f"adapter {ref} failed verification" in str(err.value)
        finally:
            fresh.close()
        base = _answers(loop.run_until_complete(clf.classify(docs, None)))  # the engine still serves everyone
        assert len(base) == len(docs)
    finally:
        service.close()
    assert not service._copy_root  # the private copies are removed at shutdown


def test_a_cancelled_request_leaves_the_engine_before_the_other_group_is_admitted():
    """The hang-up path with a stand-in vLLM (bookkeeping; the real engine runs it in test_serve_http)."""
    from unittest.mock import MagicMock

    from classify.engine.prompt import Prompt
    from classify.records import Result
    from serve.engine import AsyncClassifier

    events = []

    class LLM:
        async def generate(self, prompt, params, request_id, lora_request=None):
            events.append(("start", request_id, "lora" if lora_request else "base"))
            try:
                await asyncio.sleep(0.2 if lora_request else 30)
            except asyncio.CancelledError:
                events.append(("cancelled", request_id))
                raise
            yield MagicMock(outputs=[MagicMock()])

        async def abort(self, ids):
            events.append(("abort", tuple(ids)))

    scorer = MagicMock()
    def prompt(_doc):  # a Prompt whatever its fields (any attribute the engine call reads is there)
        rendered = MagicMock()
        rendered.__class__ = Prompt
        rendered.n_windows = 1  # one window: one engine request per document
        rendered.engine_inputs.return_value = [{"prompt_token_ids": [1, 2, 3]}]
        return rendered

    scorer.prompt.side_effect = prompt
    scorer.prompts.side_effect = lambda batch: [prompt(d) for d in batch]  # the engine's one batched call
    scorer.result.side_effect = lambda doc, prompt, completion, t: Result(id=doc.id, status="accepted",
                                                                          category="tech", score=0.5)
    clf = AsyncClassifier(LLM(), scorer, MagicMock(), lora_enabled=True)
    docs = [document_from_text(f"d{i}", "x", 1000, "t") for i in range(3)]
    lora = MagicMock(temperature=1.0)

    async def scenario():
        base = asyncio.create_task(clf.classify(docs))
        await asyncio.sleep(0.05)
        adapter = asyncio.create_task(clf.classify(docs[:1], lora))  # waits: the base phase runs
        await asyncio.sleep(0.05)
        assert clf.gate.active == ("base", 1)
        base.cancel()  # the client hung up
        with pytest.raises(asyncio.CancelledError):
            await base
        assert clf.gate.active[0] in ("lora", None)  # returned only once the base requests were aborted
        return await adapter

    results = asyncio.run(scenario())
    assert [r.id for r in results] == ["d0"]
    kinds = [e[0] for e in events]
    base_ids = tuple(e[1] for e in events if e[0] == "start" and e[2] == "base")
    assert len(base_ids) == 3 and ("abort", base_ids) in events
    first_lora = next(i for i, e in enumerate(events) if e[0] == "start" and e[2] == "lora")
    assert kinds.index("abort") < first_lora  # aborted in the engine before any adapter request was sent
    assert kinds[:first_lora].count("cancelled") == 3 and clf.aborted == 3


def test_the_served_path_gives_one_result_per_long_document_with_its_windows(mixed, pilot_config, bbc_dir):
    """Issue 41 on the real async engine: a 10 x max_doc_tokens document, served with ``long_documents: windows``, is
    one result whose windows went through the engine together; the base model and an adapter alike."""
    from classify.engine.scoring import Scorer
    from serve.engine import AsyncClassifier
    from serve.schemas import ResultOut
    from tests.support.corpora import long_document

    clf, handles, docs, loop = mixed
    tok = clf.scorer.tokenizer
    n = 64  # windows of 64 tokens: ten of them cost the engine less than three of the shipped 256 (LoRA is slow on CPU)
    cfg = clf.scorer.cfg.model_copy(update={"long_documents": "windows", "max_windows": 16, "max_doc_tokens": n})
    served = AsyncClassifier(clf.llm, Scorer(tok, cfg, clf.scorer.max_model_len), clf.model, clf.lora_enabled)
    long = document_from_text("long", long_document(tok, bbc_dir, 10 * n), 200_000)
    short = document_from_text("short", "The striker scored twice as the home side won 3-0 on Saturday.", 10_000)
    for ref in (None, handles[0]):
        before = clf.aborted
        long_row, short_row = loop.run_until_complete(served.classify([long, short], ref))
        assert long_row.status == "accepted" and long_row.category in cfg.categories and clf.aborted == before
        out = ResultOut.of(long_row).model_dump()
        assert (out["n_windows"], out["n_doc_tokens"], out["truncated"]) == (10, 10 * n, False)
        (alone,) = loop.run_until_complete(clf.classify([short], ref))  # the shipped cut config, same engine
        assert short_row.n_windows == 1 and short_row.category == alone.category
        assert short_row.score == pytest.approx(alone.score, abs=score_tolerance(pilot_config.model))
