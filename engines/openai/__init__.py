"""The engine protocol over an OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp, `evalsuite serve`)."""

from engines.openai.client import OpenAIEngine

__all__ = ["OpenAIEngine"]
