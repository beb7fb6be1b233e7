"""What the routes of both APIs share: the model manager and the server's settings."""

from __future__ import annotations

import time
from typing import Callable, Optional

from ..core import __version__
from .models_manager import ModelManager


class ServerState:
    """What the routes share: the loaded models (:mod:`.models_manager`), the settings."""

    def __init__(self, models: ModelManager, *, api_key: Optional[str], max_body: int, expose_paths: bool = False,
                 log_requests: bool = True) -> None:
        self.models = models
        self.expose_paths = expose_paths   # /v1/models shows the models' files (serve --expose-paths)
        self.log_requests = log_requests   # one log line per request (serve --quiet: none)
        self.api_key = api_key
        self.max_body = max_body
        self.created = int(time.time())
        self.fingerprint = f"localspec-{__version__}"
        self.on_close: Optional[Callable[[], None]] = None
        self._closed = False

    @property
    def names(self) -> list[str]:
        """The default model's names (the one a request without ``model`` gets)."""
        return [self.models.default_name()]

    def close(self) -> None:
        """Stop the workers and close their engines, then call ``on_close``; once."""
        if self._closed:
            return
        self._closed = True
        self.models.close()
        if self.on_close is not None:
            self.on_close()
