"""``localspec serve``: an OpenAI-compatible HTTP server over one engine.

Modules: :mod:`.errors` (OpenAI's error shape), :mod:`.schemas` (request bodies, pydantic),
:mod:`.params` (request fields -> the engine's GenerationConfig), :mod:`.worker` (the one engine
thread, its bounded queue and the thread-safe bridge to async handlers), :mod:`.metrics`
(Prometheus, in llama-server's and vLLM's names), :mod:`.app` (the routes).
"""
