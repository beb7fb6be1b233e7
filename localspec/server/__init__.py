"""``localspec serve``: one HTTP server over every model in the store (loaded on demand), with two
APIs: OpenAI's under ``/v1`` (:mod:`.openai`) and Ollama's under ``/api`` (:mod:`.ollama`).

Both APIs run on one shared core: :mod:`.app` (the app mounting both, middleware, error handlers),
:mod:`.state`, :mod:`.bodies` (the API key, request bodies), :mod:`.errors` (both error shapes,
the model manager's typed errors), :mod:`.answering` (one generating request: admission,
disconnects, SSE and NDJSON streams), :mod:`.stats` (finish reasons, the speculative block),
:mod:`.schemas`, :mod:`.params` and :mod:`.features` (an OpenAI-shaped request, which Ollama's
requests are turned into, to a prompt and a GenerationConfig), :mod:`.models_manager`,
:mod:`.worker` (one engine thread per model), :mod:`.metrics`, :mod:`.request_log`, :mod:`.run`.
"""
