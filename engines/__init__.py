"""Engines: things that turn token ids into logits. evalsuite judges them through engines.base.

PUBLIC is the shared part every engine and the judge stand on: the plugin protocol and its records, the model's
config, weights, tokenizers and loaders, the errors, and the compile cache. evalsuite imports only these; an
engine's internals (the reference, the megakernel, the server client, the generation loops) it reaches through
the plugin loader (evalsuite/plugins.py) alone, so no engine is built or judged by a path the others lack."""

PUBLIC = ("base", "errors", "config", "weights", "tokenizer", "gguf_loader", "gguf_file", "hf_loader", "lazy",
          "compile_cache", "mxfp4", "recipe")
