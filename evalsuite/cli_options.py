"""The command line's shared options: where a server engine is, engine options, benchmark data."""

from __future__ import annotations

import click

from evalsuite.errors import SpecError


def remote_options(f):
    """--base-url, --served-model, --api-key-env, --timeout: where --engine openai's server is."""
    f = click.option("--timeout", "api_timeout", default=None, type=click.FloatRange(0.1, None),
                     help="--engine openai: seconds per HTTP request (default: sized from the server's pace at the "
                          "probe, at least 300; a request past it is never sent again).")(f)
    f = click.option("--api-key-env", default=None,
                     help="--engine openai: NAME of the environment variable holding the API key "
                          "(the key itself is never printed).")(f)
    f = click.option("--served-model", default=None,
                     help="--engine openai: the server's model id (default: the only one it lists).")(f)
    f = click.option("--base-url", default=None, help="--engine openai: e.g. http://127.0.0.1:8000/v1")(f)
    return f


def engine_option(f):
    return click.option("--engine-option", "engine_options", multiple=True, metavar="KEY=VALUE",
                        help="An engine's own setting (repeatable; `evalsuite engines` lists each engine's keys), "
                             "e.g. megakernel batch_invariant=1.")(f)


def _engine_options(pairs) -> tuple[tuple[str, str], ...]:
    out = []
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"--engine-option {p!r}: expected KEY=VALUE")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def _data(data, data_dir):
    if data is not None and data_dir is not None and data != data_dir:
        raise SpecError("give --data or --data-dir, not both")
    return data if data is not None else data_dir


def _server(base_url, served_model, api_key_env, api_timeout) -> tuple[tuple[str, str], ...]:
    """--base-url and its companions as engine options of a server engine (`evalsuite engines` lists them)."""
    if base_url is None:
        return ()
    pairs = (("base_url", base_url), ("served_model", served_model), ("api_key_env", api_key_env),
             ("timeout", None if api_timeout is None else str(api_timeout)))
    return tuple((k, v) for k, v in pairs if v is not None)
