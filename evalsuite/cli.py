"""The evalsuite command line: parse flags, call one function, print. No logic here."""

from __future__ import annotations

import json
import sys

import click

from engines.errors import ModelError

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_PROMPT = "The capital of France is"


class Group(click.Group):
    """Turns user errors into one line on stderr and exit code 2; Ctrl-C into exit 130."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ModelError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=Group)
@click.version_option(package_name="evalsuite")
def main() -> None:
    """evalsuite: does a fused inference engine lose accuracy against an independent reference?"""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per model.")
def models(as_json: bool) -> None:
    """List the registered models (loads each to report parameters and weight sha256)."""
    from evalsuite.registry import REGISTRY, load_model

    rows = []
    for name, entry in REGISTRY.items():
        try:
            w = load_model(name).weights
            rows.append(dict(name=name, family=entry.family, params=w.n_params, source=entry.source,
                             sha256=w.sha256))
        except ModelError as e:
            rows.append(dict(name=name, family=entry.family, params=None, source=entry.source,
                             sha256=None, error=str(e)))
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for r in rows:
        params = f"{r['params'] / 1e6:8.2f}M" if r["params"] else "       ?"
        click.echo(f"{r['name']:<14} {r['family']:<6} {params}  {(r['sha256'] or r.get('error'))[:64]}"
                   f"  {r['source']}")


@main.command()
@click.option("--engine", default="reference", show_default=True, help="Engine to run.")
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help="Registry name or a Hugging Face checkpoint directory.")
@click.option("--prompt", default=DEFAULT_PROMPT, show_default=True, help="Prompt text.")
@click.option("--chat", is_flag=True, help="Apply the model's chat template to the prompt.")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, None))
@click.option("--no-stop", is_flag=True, help="Generate exactly --max-new-tokens, ignoring EOS.")
@click.option("--top-logprobs", default=5, show_default=True, type=click.IntRange(1, 100))
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(["float32", "bfloat16"]))
@click.option("--fault", default=None,
              help="Megakernel fault injection, a self-test aid: rope_off_by_one, kv_stale, drop_layer, "
                   "bf16_residual, router_second_choice (MoE only).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def generate(engine, model, prompt, chat, max_new_tokens, no_stop, top_logprobs, dtype, fault,
             as_json) -> None:
    """Greedy generation from one prompt."""
    from evalsuite.generate import GenerateSpec, run_generate

    spec = GenerateSpec(engine=engine, model=model, prompt=prompt, chat=chat,
                        max_new_tokens=max_new_tokens, stop=not no_stop, top_logprobs=top_logprobs,
                        dtype=dtype, fault=fault)
    result = run_generate(spec)
    click.echo(json.dumps(result) if as_json else result["text"])


if __name__ == "__main__":
    main()
