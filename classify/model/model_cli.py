"""``docpilot model``: provision the configured base model into the local model cache."""

from __future__ import annotations

import argparse
import json

from classify.config.sections import PilotConfig, load_config
from classify.model.model import resolve_model
from classify.usercommand import cli_description


def main(argv: list[str]) -> int:
    """Resolve (and for the default model, de-quantize once) the base model; print its ref as JSON."""
    parser = argparse.ArgumentParser(prog="docpilot model", description=cli_description(__doc__))
    parser.add_argument("--config", default="config/docpilot.json", help="config whose model section to use")
    args = parser.parse_args(argv)
    cfg = load_config(PilotConfig, args.config)
    ref = resolve_model(cfg.model)
    print(json.dumps(ref.__dict__, indent=2))
    return 0
