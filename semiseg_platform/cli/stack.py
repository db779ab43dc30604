"""``npsemiseg stack ...``: the local stack's command group."""

from __future__ import annotations

from semiseg_platform.cli.app import app
from semiseg_platform.devstack import stack_app

app.add_typer(stack_app(), name="stack")
