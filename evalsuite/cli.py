"""The evalsuite command line: parse flags, call one function, print. No logic here."""

from __future__ import annotations

import sys

import click

from engines.base import DTYPES
from engines.errors import ModelError, UnsupportedModel
from evalsuite.cli_options import _data, _engine_options, _server, engine_option, remote_options
from evalsuite.distributed import writes_files
from evalsuite.errors import SpecError
from evalsuite.report import dumps
from evalsuite.roles import DEFAULT_ENGINE, JUDGE
from evalsuite.verdict import exit_code

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_PROMPT = "The capital of France is"
FAULT_HELP = ("Fault injection, a self-test aid: one of the engine's own faults (`evalsuite engines` lists them; "
              "the megakernel's include drop_layer, stale_feedback).")
DATA_HELP = ("Benchmark items: bundled (the samples shipped, offline; default), hub (the real sets through "
             "`datasets`, cached; GPQA needs HF_TOKEN), or a folder of files in the hub schema (e.g. ../shared/data).")
REQUIRE_HELP = ("Make a claim a verdict condition (repeatable): batch-invariance (tokens and top-k logprobs of the "
                "first 8 prompts bitwise the same alone and in batches of 2-8, seeded order).")
ENGINE_HELP = "An installed engine (`evalsuite engines` lists them: reference, megakernel, openai and plugins)."


class Group(click.Group):
    """Turns user errors into one line on stderr and exit code 2; Ctrl-C into exit 130."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (ModelError, SpecError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=Group)
@click.version_option(package_name="evalsuite")
@click.option("--mesh", default=None, envvar="EVALSUITE_MESH", metavar="tp=N,dp=N,ep=N",
              help="Shard the reference (engine or judge) on a JAX mesh: tensor parallel over heads and MLP columns, "
                   "expert parallel, data parallel over batch rows (env EVALSUITE_MESH).")
@click.option("--num-processes", default=None, type=click.IntRange(1, None), envvar="EVALSUITE_NUM_PROCESSES",
              help="Run as one of N processes (jax.distributed; generate, diff and golden check).")
@click.option("--process-id", default=None, type=int, envvar="EVALSUITE_PROCESS_ID",
              help="This process's id in [0, N).")
@click.option("--coordinator", default=None, envvar="JAX_COORDINATOR_ADDRESS", metavar="HOST:PORT",
              help="Process 0's address, the same for every process.")
@click.pass_context
def main(ctx, mesh, num_processes, process_id, coordinator) -> None:
    """evalsuite: does a fused inference engine lose accuracy against an independent reference?"""
    from engines import compile_cache
    from evalsuite import distributed

    distributed.set_mesh(mesh)
    distributed.initialize(ctx.invoked_subcommand, coordinator, num_processes, process_id)
    compile_cache.enable()


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per model.")
def models(as_json: bool) -> None:
    """List the registered models (loads each to report parameters and weight sha256)."""
    from evalsuite.models import describe
    from evalsuite.report import models_text

    rows = describe()
    click.echo(dumps(rows, indent=1) if as_json else models_text(rows))


@main.command("engines")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
def engines_cmd(as_json: bool) -> None:
    """List the installed engines (entry-point group evalsuite.engines): built-in and plugins."""
    from evalsuite.plugins import describe
    from evalsuite.report import engines_text

    rows = describe()
    click.echo(dumps(rows, indent=1) if as_json else engines_text(rows))
    sys.exit(0 if all(r["ok"] for r in rows) else 2)


@main.command()
@click.option("--engine", default=JUDGE, show_default=True, help=ENGINE_HELP)
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help="Registry name or a Hugging Face checkpoint directory.")
@click.option("--prompt", default=DEFAULT_PROMPT, show_default=True, help="Prompt text.")
@click.option("--chat", is_flag=True, help="Apply the model's chat template to the prompt.")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, None))
@click.option("--no-stop", is_flag=True, help="Generate exactly --max-new-tokens, ignoring EOS.")
@click.option("--top-logprobs", default=5, show_default=True, type=click.IntRange(1, 100))
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(DTYPES))
@click.option("--fault", default=None, help=FAULT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@engine_option
@remote_options
def generate(engine, model, prompt, chat, max_new_tokens, no_stop, top_logprobs, dtype, fault,
             as_json, engine_options, base_url, served_model, api_key_env, api_timeout) -> None:
    """Greedy generation from one prompt."""
    from evalsuite.generate import GenerateSpec, run_generate

    spec = GenerateSpec(engine=engine, model=model, prompt=prompt, chat=chat,
                        max_new_tokens=max_new_tokens, stop=not no_stop, top_logprobs=top_logprobs,
                        dtype=dtype, fault=fault, engine_options=_engine_options(engine_options)
                        + _server(base_url, served_model, api_key_env, api_timeout))
    result = run_generate(spec)
    click.echo(dumps(result) if as_json else result["text"])


def _progress(msg: str) -> None:
    click.echo(msg, err=True)




@main.command()
@click.option("--engine", default=DEFAULT_ENGINE, show_default=True, help=ENGINE_HELP)
@click.option("--against", default=JUDGE, show_default=True, help="The judge (float32).")
@click.option("--model", default=DEFAULT_MODEL, show_default=True)
@click.option("--prompts", default="builtin", show_default=True,
              help="Built-in prompt set (builtin, quick) or a JSONL file.")
@click.option("--max-new-tokens", default=32, show_default=True, type=int)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES),
              help="The engine's precision mode; the reference always runs float32.")
@click.option("--batch", default=8, show_default=True, type=int, help="Rows per engine call (1-8).")
@click.option("--fault", default=None, help=FAULT_HELP)
@click.option("--noise-tol", default=None, type=float, help="Override the dtype's noise tolerance.")
@click.option("--require", "require", multiple=True, help=REQUIRE_HELP)
@click.option("--seed", default=0, show_default=True, type=int, help="Request order of --require batch-invariance.")
@click.option("--float32-build/--no-float32-build", default=True, show_default=True,
              help="bfloat16: also diff the engine built in float32 on the same prompts (code bugs below bf16 "
                   "rounding); about doubles the time.")
@click.option("--batching/--no-batching", default=True, show_default=True,
              help="The batching part: every prompt in one call with staggered stops, so the engine refills, "
                   "shrinks and splits its prefill as in a benchmark (off: those paths are not checked).")
@engine_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write report.md, results.json and dlogit.png here.")
@remote_options
def diff(engine, against, model, prompts, max_new_tokens, dtype, batch, fault, noise_tol, require, seed,
         float32_build, batching, engine_options, as_json, report_dir, base_url, served_model, api_key_env,
         api_timeout) -> None:
    """Greedy decoding through ENGINE vs the reference, token by token. Exit 0 PASS, 1 FAIL."""
    from pathlib import Path

    from evalsuite.compare.diff import DiffSpec, run_diff
    from evalsuite.report import diff_report, diff_slim, diff_text

    spec = DiffSpec(engine=engine, against=against, model=model, prompts=prompts,
                    max_new_tokens=max_new_tokens, dtype=dtype, batch=batch, fault=fault, noise_tol=noise_tol,
                    require=tuple(require), seed=seed, float32_build=float32_build, batching=batching,
                    engine_options=_engine_options(engine_options) + _server(base_url, served_model, api_key_env,
                                                                             api_timeout))
    result = run_diff(spec, _progress).to_json()
    if report_dir and writes_files():
        for p in diff_report(result, Path(report_dir)):
            _progress(f"wrote {p}")
    click.echo(dumps(diff_slim(result)) if as_json else diff_text(result))
    sys.exit(exit_code(result["verdict"]))


@main.group()
def golden() -> None:
    """Golden outputs of the reference (golden/<model>.json)."""


@golden.command("update")
@click.option("--model", "models_", multiple=True, help="Model(s); default: every model with golden settings.")
def golden_update(models_) -> None:
    """Write golden files from the float32 reference."""
    from evalsuite import golden as g

    models, skipped = (list(models_), {}) if models_ else g.default_models()
    for m, why in skipped.items():
        _progress(f"golden: skipped {m}: {why}")
    for m in models:
        _progress(f"golden: updating {m}")
        click.echo(f"wrote {g.update(m)}")


@golden.command("check")
@click.option("--model", "models_", multiple=True, help="Model(s); default: every model with golden settings.")
@click.option("--engine", default=JUDGE, show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES))
@click.option("--fault", default=None, help=FAULT_HELP)
@click.option("--float32-build/--no-float32-build", default=True, show_default=True,
              help="bfloat16: also check the engine built in float32 (code bugs below bf16 rounding).")
@click.option("--json", "as_json", is_flag=True)
@remote_options
@engine_option
def golden_check(models_, engine, dtype, fault, float32_build, as_json, base_url, served_model, api_key_env,
                 api_timeout, engine_options) -> None:
    """Compare an engine with the golden files. Exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE (not checked)."""
    from evalsuite import golden as g
    from evalsuite.report import golden_text
    from evalsuite.verdict import combine

    server = dict(_engine_options(engine_options) + _server(base_url, served_model, api_key_env, api_timeout))
    results = {}
    models, skipped = (list(models_), {}) if models_ else g.default_models()
    for m in models:
        _progress(f"golden: checking {engine} on {m}")
        try:
            results[m] = g.check(m, engine, dtype, fault, extra=server, float32_build=float32_build).to_json()
        except UnsupportedModel as e:
            if models_:  # named by the user: an error
                raise
            skipped[m] = str(e)  # the default list: every golden model, not all of which an engine implements
            _progress(f"golden: skipped {m}: {e}")
    if not results:
        raise SpecError(f"engine {engine} implements none of the golden models ({', '.join(skipped)})")
    verdict = combine(r["verdict"] for r in results.values())
    click.echo(dumps({"verdict": verdict, "models": results, "skipped": skipped}) if as_json
               else golden_text(results) + "".join(f"\nskipped {m}: {why}" for m, why in skipped.items()))
    sys.exit(exit_code(verdict))


@main.command("run")
@click.argument("task")
@click.option("--variant", default=None,
              help="gsm8k: 5shot (default), chat or cot (lm-eval's gsm8k_cot, 8 fixed exemplars); "
                   "gpqa: mc (default) or cot; sanity: gen (default) or mc.")
@click.option("--engine", default=DEFAULT_ENGINE, show_default=True)
@click.option("--against", default=JUDGE, show_default=True)
@click.option("--model", default=DEFAULT_MODEL, show_default=True)
@click.option("--limit", default=None, type=int, help="First N items only.")
@click.option("--data", "data", default=None, help=DATA_HELP)
@click.option("--data-dir", default=None, help="The same as --data DIR.")
@click.option("--output", default="runs/latest", show_default=True, help="Run folder (resumable).")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES))
@click.option("--fault", default=None, help=FAULT_HELP)
@click.option("--margin", default=0.02, show_default=True, type=float, help="Non-inferiority margin (share).")
@click.option("--seed", default=1234, show_default=True, type=int,
              help="lm-eval's few-shot (and numpy, torch) seed; 1234 is lm-eval's own default.")
@click.option("--shard", default=None, metavar="i/N",
              help="Run only the items with doc_id %% N == i (own folder and journal); `evalsuite merge` combines "
                   "the N shards into the unsharded result.")
@click.option("--judge-decodes", is_flag=True,
              help="The judge decodes every answer itself instead of scoring the engine's answers in one "
                   "teacher-forced pass (the same answers and verdict, at the cost of a second decode).")
@click.option("--json", "as_json", is_flag=True)
@engine_option
@remote_options
def run_cmd(task, variant, engine, against, model, limit, data, data_dir, output, dtype, fault, margin, seed,
            shard, judge_decodes, as_json, engine_options, base_url, served_model, api_key_env, api_timeout) -> None:
    """Benchmark TASK (gsm8k, gpqa, sanity) on ENGINE and the reference; paired verdict.
    Exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 2 usage error."""
    from evalsuite.bench.run import RunSpec, run_benchmark

    spec = RunSpec(task=task, variant=variant, engine=engine, against=against, model=model, limit=limit,
                   data_dir=_data(data, data_dir), output=output, dtype=dtype, fault=fault, margin=margin, seed=seed,
                   shard=shard, judge_decodes=judge_decodes, engine_options=_engine_options(engine_options)
                   + _server(base_url, served_model, api_key_env, api_timeout))
    from evalsuite.report import run_text

    r = run_benchmark(spec, _progress).to_json()
    click.echo(dumps(r) if as_json else run_text(r))
    sys.exit(exit_code(r["verdict"]))


@main.command("merge")
@click.argument("run_dirs", nargs=-1, required=True)
@click.option("--output", default="runs/merged", show_default=True, help="Folder for the merged result.")
@click.option("--json", "as_json", is_flag=True)
def merge_cmd(run_dirs, output, as_json) -> None:
    """Combine the N shard folders of one `run --shard i/N` into the unsharded run's result and verdict.
    Exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 2 usage error (a missing or repeated shard, shards of different runs)."""
    from evalsuite.bench.merge import merge_runs
    from evalsuite.report import run_text

    r = merge_runs(list(run_dirs), output).to_json()
    click.echo(dumps(r) if as_json else run_text(r))
    sys.exit(exit_code(r["verdict"]))


@main.command("export")
@click.argument("run_dir")
@click.option("--output", required=True, help="Folder for the export (`merge` takes it like a run folder).")
def export_cmd(run_dir, output) -> None:
    """A run's (or shard's) per-item evidence without the benchmark's text (prompts, gold answers; GPQA's
    responses as sha256), fit to publish. Exit 0, or 2 when RUN_DIR is not a finished run."""
    from evalsuite.bench.export import export_run

    click.echo(dumps(export_run(run_dir, output)))


@main.command()
@click.option("--engine", default=JUDGE, show_default=True, help=ENGINE_HELP)
@click.option("--model", default=DEFAULT_MODEL, show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES))
@click.option("--fault", default=None, help=FAULT_HELP)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--served-model-name", default=None, help="Model id in the API (default: --model).")
@engine_option
def serve(engine, model, dtype, fault, host, port, served_model_name, engine_options) -> None:
    """Serve ENGINE over an OpenAI-compatible HTTP API (vLLM's shapes) until interrupted."""
    from evalsuite.serve import serve as run_server

    run_server(engine, model, dtype, fault, host, port, served_model_name, dict(_engine_options(engine_options)))


@main.command("lm-eval", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                           "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def lm_eval_cmd(args) -> None:
    """lm-eval's own command line with `evalsuite` (engine=NAME) and evalsuite-NAME for every installed engine."""
    from lm_eval.__main__ import cli_evaluate

    import evalsuite.bench.adapter  # noqa: F401  (registers the models)

    sys.argv = ["lm_eval", *args]
    cli_evaluate()


@main.command()
@click.option("--model", default=DEFAULT_MODEL, show_default=True)
@click.option("--engine", default=DEFAULT_ENGINE, show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES))
@click.option("--fault", default=None, help=FAULT_HELP)
@click.option("--output", default="reports/verify", show_default=True)
@click.option("--parts", default="golden,diff,sanity,gsm8k,gpqa", show_default=True,
              help="The parts to run (comma-separated); the rest are reported as not run.")
@click.option("--tasks", default="sanity,gsm8k,gpqa", show_default=True,
              help="Benchmarks to run (comma-separated; --parts also chooses them).")
@click.option("--gpqa-variant", default=None, type=click.Choice(["mc", "cot"]),
              help="gpqa scored by loglikelihood (mc, the default) or by generation (cot: for servers "
                   "without prompt logprobs).")
@click.option("--data", "data", default=None, help=DATA_HELP)
@click.option("--data-dir", default=None, help="The same as --data DIR.")
@click.option("--limit", default=None, type=click.IntRange(1, None), help="First N items of each benchmark only.")
@click.option("--prompts", default="builtin", show_default=True, help="diff's prompt set.")
@click.option("--require", "require", multiple=True, help=REQUIRE_HELP)
@engine_option
@click.option("--json", "as_json", is_flag=True)
@remote_options
def verify(model, engine, dtype, fault, output, parts, tasks, gpqa_variant, data, data_dir, limit, prompts, require,
           engine_options, as_json, base_url, served_model, api_key_env, api_timeout) -> None:
    """The whole gate: golden check, diff, gsm8k, gpqa. Exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE."""
    from pathlib import Path

    from evalsuite.report import verify_markdown
    from evalsuite.verify import parse_parts, parse_tasks, run_verify

    names = parse_tasks(tasks)
    chosen = parse_parts(parts)

    r = run_verify(model, engine, dtype, fault, Path(output), _progress, tasks=names,
                   data_dir=_data(data, data_dir), limit=limit, prompts=prompts, require=tuple(require),
                   engine_options=_engine_options(engine_options)
                   + _server(base_url, served_model, api_key_env, api_timeout), parts_asked=chosen,
                   gpqa_variant=gpqa_variant).to_json()
    click.echo(dumps(r) if as_json else verify_markdown(r))
    sys.exit(exit_code(r["verdict"]))


if __name__ == "__main__":
    main()
