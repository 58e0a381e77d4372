"""A fake ``nvidia-smi`` on PATH that answers the two queries :mod:`classify.machine.probe` makes.

``--query-gpu=...`` gets the CSV rows (name, memory.total MiB, driver, compute capability, index, uuid,
mig.mode.current), ``-L`` the listing with MIG slices, as the real tool prints them on an 8 x H100 host and
on an H100 cut into MIG slices (listing format: NVIDIA MIG User Guide, "Device Enumeration").
"""

from __future__ import annotations

from pathlib import Path

H100 = "NVIDIA H100 80GB HBM3, 81559, 580.95.05, 9.0"


def h100_uuid(i: int) -> str:
    """The UUID card ``i`` of the fake host reports."""
    return f"GPU-{i:08x}-1111-2222-3333-444444444444"


def eight_h100() -> tuple[str, str]:
    """``(query rows, -L listing)`` of an 8 x H100 host, MIG off."""
    rows = "\n".join(f"{H100}, {i}, {h100_uuid(i)}, Disabled" for i in range(8))
    listing = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {h100_uuid(i)})" for i in range(8))
    return rows, listing


MIG_UUIDS = ("MIG-aaaaaaaa-bbbb-5ccc-dddd-eeeeeeeeeeee", "MIG-ffffffff-1111-5222-3333-444444444444",
             "MIG-12345678-9999-5888-7777-666666666666")


def h100_in_mig() -> tuple[str, str]:
    """``(query rows, -L listing)`` of one H100 in MIG mode cut into a 1g.10gb, a 1c.3g.40gb (one compute instance of
    a 3g.40gb) and a 1g.20gb+me (with the media engines) slice."""
    rows = f"{H100}, 0, {h100_uuid(0)}, Enabled"
    listing = (f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {h100_uuid(0)})\n"
               f"  MIG 1g.10gb     Device  0: (UUID: {MIG_UUIDS[0]})\n"
               f"  MIG 1c.3g.40gb  Device  1: (UUID: {MIG_UUIDS[1]})\n"
               f"  MIG 1g.20gb+me  Device  2: (UUID: {MIG_UUIDS[2]})")
    return rows, listing


def install(bin_dir: Path, host: tuple[str, str]) -> Path:
    """Write the fake tool for ``host`` (:func:`eight_h100`, :func:`h100_in_mig`) into ``bin_dir``; returns its path."""
    rows, listing = host
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/sh\nif [ \"$1\" = \"-L\" ]; then\ncat <<'OUT'\n" + listing + "\nOUT\nelse\ncat <<'OUT'\n"
                    + rows + "\nOUT\nfi\n")
    tool.chmod(0o755)
    return tool
