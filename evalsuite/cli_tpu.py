"""`evalsuite budget`: the megakernel's decode step against each TPU generation's VMEM, from the static spec."""

from __future__ import annotations

import click

from engines.base import DTYPES
from evalsuite.report import dumps


@click.command("budget")
@click.option("--model", "models_", multiple=True, default=("smollm2-135m",), show_default=True,
              help="Model(s): a registered name, or a paper configuration (`k3-sized`; no weights needed).")
@click.option("--chip", "chips", multiple=True, help="TPU generation(s) (v5e, v5p, v6e, v7); default: all.")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(DTYPES), help="Default: both.")
@click.option("--batch", default=8, show_default=True, type=click.IntRange(1, None), help="Rows per step.")
@click.option("--tile", default=128, show_default=True, type=click.IntRange(8, None),
              help="Cache positions per attention tile.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
def budget_cmd(models_, chips, dtypes, batch, tile, as_json) -> None:
    """VMEM of one megakernel decode step per model, dtype and chip: what it declares, the live values' estimate,
    the limit passed to Mosaic, and whether it fits (exit 0 whether or not it does; the engine refuses)."""
    from engines.megakernel.budget import mib, model_budgets

    rows = model_budgets(models_, chips, dtypes, batch, tile)
    if as_json:
        click.echo(dumps(rows, indent=1))
        return
    for r in rows:
        b = r["budget"]
        groups = ", ".join(f"{g} {mib(n)}" for g, n in b["by_group"].items())
        verdict = "fits" if b["fits"] else "DOES NOT FIT"
        click.echo(f"{r['model']:<20} {r['dtype']:<9} TPU {b['chip']:<4} limit {mib(b['limit_bytes']):>10} of "
                   f"{mib(b['capacity_bytes']):>10}  {verdict:<12} ({groups})")
