"""Prometheus metrics in the vocabulary dashboards already know.

llama-server's names (``llamacpp:*``: token and time totals, average throughput, requests being
processed and deferred) and vLLM's (``vllm:*``: requests running and waiting, token totals,
finished requests by reason, and the speculative decoding counters ``spec_decode_num_drafts``,
``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens`` and
``spec_decode_num_accepted_tokens_per_pos`` with a ``position`` label, 0 = the first drafted
token). ``localspec:*`` adds what neither has: per-position drafted counts (drafts vary in depth
here), drafted and accepted tokens by draft source, and requests refused with 429.

Every counter is updated once per finished request, from the engine thread (prometheus_client is
thread-safe); the gauges read the worker's live state when scraped.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import disable_created_metrics

from ..core.events import GenerationStats

disable_created_metrics()  # no *_created series: llama-server and vLLM dashboards do not expect them

FINISHED_REASONS = {"stop": "stop", "length": "length", "context": "length", "cancelled": "abort",
                    "tool_calls": "tool_calls"}


class ServerMetrics:
    """The server's registry. ``running``/``waiting`` are callables giving the live queue state."""

    def __init__(self, model_name: str, *, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        self.model_name = model_name
        r = self.registry = CollectorRegistry(auto_describe=True)
        self._prompt = [0, 0.0]      # tokens, seconds: the averages' own totals
        self._predicted = [0, 0.0]
        m = ["model_name"]

        # -- llama-server (llamacpp:*) --
        self.prompt_tokens = Counter("llamacpp:prompt_tokens", "Number of prompt tokens processed.", registry=r)
        self.prompt_seconds = Counter("llamacpp:prompt_seconds", "Prompt process time.", registry=r)
        self.predicted_tokens = Counter("llamacpp:tokens_predicted", "Number of generation tokens processed.",
                                        registry=r)
        self.predicted_seconds = Counter("llamacpp:tokens_predicted_seconds", "Predict process time.", registry=r)
        Gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
              registry=r).set_function(lambda: _ratio(self._prompt))
        Gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.",
              registry=r).set_function(lambda: _ratio(self._predicted))
        Gauge("llamacpp:requests_processing", "Number of requests processing.", registry=r).set_function(running)
        Gauge("llamacpp:requests_deferred", "Number of requests deferred.", registry=r).set_function(waiting)

        # -- vLLM (vllm:*) --
        Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", m,
              registry=r).labels(model_name).set_function(running)
        Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", m,
              registry=r).labels(model_name).set_function(waiting)
        self.v_prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", m,
                                       registry=r).labels(model_name)
        self.v_generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", m,
                                           registry=r).labels(model_name)
        self.request_success = Counter("vllm:request_success", "Count of finished requests by reason.",
                                       m + ["finished_reason"], registry=r)
        for reason in sorted(set(FINISHED_REASONS.values())):
            self.request_success.labels(model_name, reason)
        self.num_drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", m,
                                  registry=r).labels(model_name)
        self.num_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", m,
                                        registry=r).labels(model_name)
        self.num_accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", m,
                                           registry=r).labels(model_name)
        self.accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position.", m + ["position"], registry=r)

        # -- localspec's own --
        self.drafted_per_pos = Counter("localspec:spec_decode_num_draft_tokens_per_pos",
                                       "Drafted tokens per draft position (drafts vary in depth).",
                                       m + ["position"], registry=r)
        self.source_drafted = Counter("localspec:spec_decode_num_draft_tokens_by_source",
                                      "Draft tokens by draft source (eagle, mtp, assistant, lookup, prediction, tree).", m + ["source"], registry=r)
        self.source_accepted = Counter("localspec:spec_decode_num_accepted_tokens_by_source",
                                       "Accepted tokens by draft source (eagle, mtp, assistant, lookup, prediction, tree).", m + ["source"], registry=r)
        self.rejected = Counter("localspec:requests_rejected", "Requests refused with 429 (queue full).", m,
                                registry=r).labels(model_name)

    def record(self, stats: GenerationStats | None, drafts: int, finish: str) -> None:
        """One finished request (``stats`` None: it never started, e.g. cancelled while queued)."""
        self.request_success.labels(self.model_name, FINISHED_REASONS.get(finish, finish)).inc()
        if stats is None:
            return
        name = self.model_name
        self._prompt = [self._prompt[0] + stats.prompt_tokens, self._prompt[1] + stats.prompt_seconds]
        self._predicted = [self._predicted[0] + stats.generated_tokens, self._predicted[1] + stats.generation_seconds]
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.prompt_seconds.inc(stats.prompt_seconds)
        self.predicted_tokens.inc(stats.generated_tokens)
        self.predicted_seconds.inc(stats.generation_seconds)
        self.v_prompt_tokens.inc(stats.prompt_tokens)
        self.v_generation_tokens.inc(stats.generated_tokens)
        self.num_drafts.inc(drafts)
        self.num_draft_tokens.inc(stats.drafted)
        self.num_accepted_tokens.inc(stats.accepted)
        for position, (drafted, accepted) in enumerate(zip(stats.drafted_per_position, stats.accepted_per_position)):
            self.drafted_per_pos.labels(name, str(position)).inc(drafted)
            self.accepted_per_pos.labels(name, str(position)).inc(accepted)
        for source, (_cycles, drafted, accepted) in stats.sources.items():
            self.source_drafted.labels(name, source).inc(drafted)
            self.source_accepted.labels(name, source).inc(accepted)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _ratio(totals: list) -> float:
    tokens, seconds = totals   # one list, replaced whole by the engine thread: read together
    return tokens / seconds if seconds > 0 else 0.0
