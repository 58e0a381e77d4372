"""Serve: the HTTP endpoint (FastAPI over vLLM's async engine) for base model + LoRA adapters. See docs/serving.md.

Rooms, by floor (single modules, a stack): a module imports modules of lower floors only.

floor 0
settings.py          pydantic-settings; refuses to start without a token
schemas.py           the request and response bodies
errors.py            the one JSON error shape
metrics.py           Prometheus + body-size middleware
engine.py            ``AsyncLLM`` + the shared ``Scorer``
adapters.py          registry look-ups, verified private copies, pilot gate
floor 1
guard.py             the token checked from the headers, before the body
body.py              the classify body parsed off the event loop
admission.py         documents in flight, 429 beyond
floor 2
conn.py              the connection guard: ``GuardedH11Protocol`` (slots, per-client cap, 401 closes)
state.py             the app's state
floor 3
deps.py              Annotated dependencies: state, bearer auth, ready engine
floor 4
routes_classify.py   one router per resource: classify, adapters, health, metrics
routes_adapters.py
routes_health.py
routes_metrics.py
floor 5
app.py               the factory and its lifespan
floor 6
cli.py               ``docpilot serve``: uvicorn on h11 with a header limit
"""
