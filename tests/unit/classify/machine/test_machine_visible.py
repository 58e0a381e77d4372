"""The cards this process can use (:meth:`classify.machine.probe.Machine.visible`): ``CUDA_VISIBLE_DEVICES`` and MIG.

The machine is a fake ``nvidia-smi`` on PATH (:mod:`tests.support.fake_smi`) answering the real probe's queries
like an 8 x H100 host and like an H100 cut into MIG slices.
"""

from __future__ import annotations

import pytest

from classify.machine import probe as machine
from tests.support import fake_smi


@pytest.fixture
def host(tmp_path, monkeypatch):
    """``host(rows_and_listing)``: install that fake nvidia-smi alone on PATH; returns the probed machine."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def make(kind):
        fake_smi.install(tmp_path / "bin", kind())
        return machine.probe(str(tmp_path))

    return make


@pytest.mark.parametrize(("spec", "indices"), [
    (None, list(range(8))),                                  # unset: every card
    ("", []),                                                # empty: none
    ("0", [0]),
    ("0,2", [0, 2]),
    ("5,1", [5, 1]),                                         # CUDA's order is the variable's
    (fake_smi.h100_uuid(3), [3]),
    (fake_smi.h100_uuid(6)[:12] + "," + fake_smi.h100_uuid(2), [6, 2]),  # a unique prefix names a card too
    ("1,-1,2", [1]),                                         # CUDA stops at the first entry naming no card
    ("9", []),
])
def test_cuda_visible_devices_picks_the_cards_by_index_and_uuid(host, spec, indices):
    m = host(fake_smi.eight_h100)
    env = {} if spec is None else {"CUDA_VISIBLE_DEVICES": spec}
    assert len(m.gpus) == 8
    assert [g.index for g in m.visible(env)] == indices
    assert all(g.memory_mib == 81559 for g in m.visible(env))


def test_a_mig_slice_is_sized_as_its_own_memory(host):
    m = host(fake_smi.h100_in_mig)
    assert [g.memory_mib for g in m.gpus] == [81559]  # --query-gpu lists the whole card only
    first = m.visible({})
    assert [(g.name, g.uuid) for g in first] == [("NVIDIA H100 80GB HBM3 MIG 1g.10gb", fake_smi.MIG_UUIDS[0])]
    assert first[0].memory_mib == 9536  # 10 GB, not the card's 80
    named = m.visible({"CUDA_VISIBLE_DEVICES": fake_smi.MIG_UUIDS[1]})
    assert [(g.name, g.memory_mib) for g in named] == [("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", 38146)]
    media = m.visible({"CUDA_VISIBLE_DEVICES": fake_smi.MIG_UUIDS[2][:12]})  # a unique prefix of a MIG UUID
    assert [(g.name, g.memory_mib) for g in media] == [("NVIDIA H100 80GB HBM3 MIG 1g.20gb+me", 19073)]
    # one process, one MIG device: naming both still gives the first
    both = m.visible({"CUDA_VISIBLE_DEVICES": ",".join(fake_smi.MIG_UUIDS)})
    assert [g.uuid for g in both] == [fake_smi.MIG_UUIDS[0]]
