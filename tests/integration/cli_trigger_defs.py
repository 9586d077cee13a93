"""Batch triggers and projections for test_cli_triggers.py, which imports this module
through the CLI's ``--import``. They register in the default registries: that test's
fixture unregisters every name below (and forgets this module) at teardown, so no other
test's worker picks them up."""

from __future__ import annotations

from pyrula.workflows import RunRecord, batch_trigger, projection

WORKFLOW = "clit_index"
TRIGGERS = ("clit_docs", "clit_quick")
PROJECTIONS = ("clit_states", "clit_all")

DELIVERED: list[str] = []
"""Run ids ``clit_all`` was given, in order."""

docs = batch_trigger("clit_docs", WORKFLOW, max_size=3, max_wait=60.0)
quick = batch_trigger("clit_quick", WORKFLOW, max_size=100, max_wait=0.5, param="items")


@projection("clit_states", workflows=[WORKFLOW, "clit_other"], batch_size=50, settle=2.0)
def clit_states(runs: list[RunRecord]) -> None:
    return None


@projection("clit_all", batch_size=2, settle=0.0)
async def clit_all(runs: list[RunRecord]) -> None:
    DELIVERED.extend(run.run_id for run in runs)
