"""``GET /v1/adapters``: the registry's adapter versions and whether this server would serve them."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from serve.deps import Authorized, State
from serve.schemas import AdapterOut, AdaptersResponse

router = APIRouter(prefix="/v1", tags=["adapters"], dependencies=[Authorized])


@router.get("/adapters", response_model=AdaptersResponse)
async def list_adapters(state: State) -> AdaptersResponse:
    """List every published adapter version: base model match, pilot status, servable, loaded.

    `servable` needs a matching base model, a passed pilot (or `--skip-pilot-gate`) and a
    loaded, live engine. A version whose `card.json` cannot be read is named in `unreadable`
    (the others are listed all the same).
    """
    rows, unreadable = await asyncio.to_thread(state.adapters.listing)
    ready = state.ready  # nothing is servable while the engine loads, failed to load, or died
    return AdaptersResponse(
        model=state.model.name,
        model_fingerprint=state.model.fingerprint,
        skip_pilot_gate=state.settings.skip_pilot_gate,
        adapters=[AdapterOut(**{**row, "servable": row["servable"] and ready}) for row in rows],
        unreadable=unreadable,
    )
