"""Downloads from the Hugging Face Hub (through ``huggingface_hub``): files, revisions, timeouts,
checksums, repository listings. Nothing here writes the model registry (that is
:mod:`localspec.store.install`); every file is fetched by :func:`download`.

Files go to huggingface_hub's own cache (``HF_HOME`` / ``HF_HUB_CACHE``), so models already
downloaded by other tools are reused; ``HF_ENDPOINT`` picks the server and ``HF_HUB_OFFLINE=1``
allows only what the cache has. These variables are read when a download starts (not when
huggingface_hub was imported). Progress bars are huggingface_hub's; an interrupted transfer is
resumed by huggingface_hub with an HTTP range request. Every file with a known SHA-256 is verified
after download; a file that does not match is removed from the cache and reported.

Every network wait is bounded: ``--timeout`` (or ``$LOCALSPEC_HUB_TIMEOUT``, default 20 s) limits
each connection and read. A quick metadata request comes first, without huggingface_hub's retry loop
(which would wait minutes on a server that never answers): when it fails the cache is used, or the
error is one line. huggingface_hub's retry warnings show only with ``--verbose``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, TypeVar

from ..core.errors import LocalspecError, NotFound
from ..core.options import ENV_TRUE
from . import repo_files

CHECKPOINT_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
TIMEOUT_ENV = "LOCALSPEC_HUB_TIMEOUT"
DEFAULT_TIMEOUT = 20.0   # seconds a connection or a read may wait
T = TypeVar("T")

_timeout: float | None = None   # set by --timeout
_verbose = False


def configure(*, timeout: float | None = None, verbose: bool | None = None) -> None:
    """The command line's ``--timeout`` and ``--verbose`` for the downloads that follow."""
    global _timeout, _verbose
    if timeout is not None:
        _timeout = check_timeout(timeout, "--timeout")
    if verbose is not None:
        _verbose = verbose


def check_timeout(value: float, what: str) -> float:
    if not (value > 0 and value <= 24 * 3600):   # also rejects NaN
        raise LocalspecError(f"{what} must be a number of seconds above 0 (at most a day), got {value}")
    return float(value)


def hub_timeout() -> float:
    """Seconds a Hub connection or read may wait: --timeout, else $LOCALSPEC_HUB_TIMEOUT, else 20."""
    if _timeout is not None:
        return _timeout
    env = os.environ.get(TIMEOUT_ENV, "").strip()
    if not env:
        return DEFAULT_TIMEOUT
    try:
        value = float(env)
    except ValueError:
        raise LocalspecError(f"{TIMEOUT_ENV} must be a number of seconds (got '{env}')") from None
    return check_timeout(value, TIMEOUT_ENV)


@contextlib.contextmanager
def _bounded() -> Iterator[float]:
    """huggingface_hub's metadata and download timeouts set to :func:`hub_timeout`, and its retry
    warnings silenced unless --verbose, for the duration of the block; yields the timeout."""
    import huggingface_hub.constants as hf_constants

    timeout = hub_timeout()
    saved = {k: getattr(hf_constants, k, None) for k in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")}
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    for key in saved:
        setattr(hf_constants, key, timeout)
    if not _verbose:
        logger.setLevel(logging.ERROR)
    try:
        yield timeout
    finally:
        for key, value in saved.items():
            setattr(hf_constants, key, value)
        logger.setLevel(level)


def _unreachable(probe: Callable[[float], object], timeout: float) -> str | None:
    """Run one metadata request (``probe(timeout)``, no retries); why the Hub cannot be reached, or
    None when it answered (an HTTP error is an answer: the download reports it properly)."""
    from huggingface_hub import errors as hf_errors

    try:
        probe(timeout)
    except hf_errors.HfHubHTTPError:
        return None
    except Exception as exc:   # connection refused, timeout, DNS: huggingface_hub's HTTP client errors
        name = type(exc).__name__
        if "Timeout" in name:
            return f"no answer within {timeout:g} s"
        text = str(exc).splitlines()[0] if str(exc) else ""
        return f"{name}: {text}" if text else name
    return None


def _endpoint_name(settings: dict) -> str:
    return settings["endpoint"] or "huggingface.co"


def _cached_or_fail(where: str, reason: str, settings: dict, from_cache: Callable[[], T]) -> T:
    try:
        return from_cache()
    except Exception:
        raise LocalspecError(f"{where}: cannot reach the Hugging Face Hub ({_endpoint_name(settings)}: {reason}) "
                             f"and it is not cached; check the network, or allow more time with --timeout "
                             f"or {TIMEOUT_ENV}") from None


@dataclass(frozen=True)
class HFRef:
    repo: str
    path: str | None = None         # a file (or subfolder) inside the repository
    revision: str | None = None


_REF_RE = re.compile(
    r"^(?:hf://|hf\.co/|huggingface\.co/|https?://(?:www\.)?(?:hf\.co|huggingface\.co)/)"
    r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)"
    r"(?:/(?:resolve|blob|tree)/(?P<urlrev>[^/]+))?"
    r"(?:/(?P<path>[^@]+?))?/?"
    r"(?:@(?P<rev>[\w./-]+))?$"
)


def parse_hf_ref(value: str) -> HFRef | None:
    """``hf.co/OWNER/REPO[/PATH][@REVISION]`` (also ``hf://``, ``huggingface.co/`` and page URLs)."""
    m = _REF_RE.match(value.strip())
    if m is None:
        return None
    return HFRef(m.group("repo"), m.group("path") or None, m.group("rev") or m.group("urlrev"))


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ENV_TRUE


def _settings() -> dict:
    endpoint = os.environ.get("HF_ENDPOINT") or None
    cache = os.environ.get("HF_HUB_CACHE")
    if not cache and os.environ.get("HF_HOME"):
        cache = os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return {"endpoint": endpoint.rstrip("/") if endpoint else None, "cache_dir": cache or None,
            "local_files_only": offline()}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _drop_from_cache(path: Path) -> None:
    """Remove a cached file: the snapshot link and the blob it points to."""
    blob = Path(os.path.realpath(path))
    for p in (path, blob):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


class FileMissing(LocalspecError):
    """The repository answered and has no such file (or, offline, the cache has none): the case in
    which ``pull`` looks for the file under another name. Network failures are not this."""


@contextlib.contextmanager
def _hub_errors(where: str, repo: str, revision: str | None, settings: dict,
                filename: str | None = None) -> Iterator[None]:
    """huggingface_hub's failures inside the block as one-line errors naming ``where``."""
    from huggingface_hub import errors as hf_errors

    try:
        yield
    except LocalspecError:
        raise
    except hf_errors.LocalEntryNotFoundError:
        if settings["local_files_only"]:
            raise FileMissing(f"{where} is not in the Hugging Face cache and HF_HUB_OFFLINE is set "
                              "(unset it to download)") from None
        raise LocalspecError(f"{where}: cannot reach the Hugging Face Hub "
                             f"({_endpoint_name(settings)}) and the file is not cached") from None
    except hf_errors.GatedRepoError:
        raise LocalspecError(f"{where}: the repository is gated; accept its terms on huggingface.co "
                             "and log in with `hf auth login`") from None
    except hf_errors.RepositoryNotFoundError:
        raise NotFound(f"{where}: repository '{repo}' not found (or private)") from None
    except hf_errors.RevisionNotFoundError:
        raise NotFound(f"{where}: revision '{revision}' not found in {repo}") from None
    except hf_errors.RemoteEntryNotFoundError:
        raise FileMissing(f"{where}: no file '{filename}' in {repo}") from None
    except hf_errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise LocalspecError(f"{where}: download failed (HTTP {status})") from None
    except ValueError as exc:      # e.g. a malformed repo id
        raise LocalspecError(f"{where}: {exc}") from None
    except OSError as exc:         # size mismatch after retries, disk full, connection lost for good
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LocalspecError(f"{where}: download failed ({msg})") from None
    except Exception as exc:       # network errors of huggingface_hub's HTTP client
        raise LocalspecError(f"{where}: download failed ({type(exc).__name__}: {exc})") from None


def download(repo: str, filename: str, *, revision: str | None = None, sha256: str | None = None) -> Path:
    """One file of ``repo`` in the HF cache (downloaded unless cached), verified when ``sha256`` is known.

    Every download of localspec goes through here (catalog files, ``hf.co/`` references, and the
    checkpoints that ``convert`` is given by repo id)."""
    return _download(repo, filename, revision, sha256, _settings())


def _download(repo: str, filename: str, revision: str | None, sha256: str | None, settings: dict) -> Path:
    try:
        import huggingface_hub as hf
    except ImportError:  # pragma: no cover - a declared dependency
        raise LocalspecError("downloading models needs the 'huggingface_hub' package") from None

    where = f"{repo}/{filename}" + (f"@{revision}" if revision else "")
    with _hub_errors(where, repo, revision, settings, filename), _bounded() as timeout:
        if not settings["local_files_only"]:
            url = hf.hf_hub_url(repo, filename, revision=revision, endpoint=settings["endpoint"])
            reason = _unreachable(lambda t: hf.get_hf_file_metadata(url, timeout=t), timeout)
            if reason is not None:
                path = Path(_cached_or_fail(where, reason, settings, lambda: hf.hf_hub_download(
                    repo, filename, revision=revision, **{**settings, "local_files_only": True})))
                return _verified(path, where, sha256)
        path = Path(hf.hf_hub_download(repo, filename, revision=revision, etag_timeout=timeout, **settings))
    return _verified(path, where, sha256)


def _verified(path: Path, where: str, sha256: str | None) -> Path:
    if sha256 is not None:
        got = sha256_file(path)
        if got != sha256.lower():
            _drop_from_cache(path)
            raise LocalspecError(f"{where}: checksum mismatch (expected sha256 {sha256}, got {got}); "
                                 "the file was removed from the cache, try again")
    return path


# --------------------------------------------------------------------------------------------
# repository listings


def _cached_listing(repo: str, revision: str | None, cache_dir: str | None) -> list[str] | None:
    """Files of the cached snapshot of ``repo`` at ``revision`` (a branch, tag or commit; default
    main), as huggingface_hub's cache scan finds them (offline listing); None when not cached."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        cache = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return None
    rev = revision or "main"
    for cached in cache.repos:
        if cached.repo_type != "model" or cached.repo_id != repo:
            continue
        for snapshot in cached.revisions:
            if rev in snapshot.refs or snapshot.commit_hash == rev:
                return sorted(f.file_path.relative_to(snapshot.snapshot_path).as_posix() for f in snapshot.files)
    return None


def list_files(repo: str, revision: str | None = None) -> list[str] | None:
    """The repository's file paths at ``revision``; None when no listing can be had."""
    settings = _settings()
    if settings["local_files_only"]:
        return _cached_listing(repo, revision, settings["cache_dir"])
    try:
        from huggingface_hub import HfApi

        with _bounded():   # the Hub timeout, and huggingface_hub's retry warnings quiet
            return sorted(HfApi(endpoint=settings["endpoint"]).list_repo_files(repo, revision=revision))
    except Exception:   # no listing (network, permissions): the caller reports its original error
        return None


def download_repo(repo: str, patterns: list[str], *, revision: str | None = None) -> Path:
    """The files of ``repo`` whose paths match one of ``patterns`` (``fnmatch``, as huggingface_hub's
    ``allow_patterns``), each fetched by :func:`download`; the snapshot directory that holds them.

    After a metadata request without retries, an unreachable Hub leaves the cache alone to answer."""
    import huggingface_hub as hf

    settings = _settings()
    where = repo + (f"@{revision}" if revision else "")
    with _hub_errors(where, repo, revision, settings), _bounded() as timeout:
        if not settings["local_files_only"]:
            api = hf.HfApi(endpoint=settings["endpoint"])
            reason = _unreachable(lambda t: api.model_info(repo, revision=revision, timeout=t), timeout)
            if reason is not None:
                settings = {**settings, "local_files_only": True}
                listing = _cached_or_fail(where, reason, settings, lambda: _cached_listing(
                    repo, revision, settings["cache_dir"]) or _not_cached(where))
            else:
                listing = sorted(api.list_repo_files(repo, revision=revision))
        else:
            listing = _cached_listing(repo, revision, settings["cache_dir"])
            if listing is None:
                raise FileMissing(f"{where} is not in the Hugging Face cache and HF_HUB_OFFLINE is set "
                                  "(unset it to download)")
    wanted = [f for f in listing if any(fnmatch(f, p) for p in patterns)]
    if not wanted:
        raise LocalspecError(f"{where}: no {', '.join(patterns)} in the repository")
    paths = [_download(repo, f, revision, None, settings) for f in wanted]
    return paths[0].parents[len(PurePosixPath(wanted[0]).parts) - 1]


def _not_cached(where: str) -> list[str]:
    raise FileMissing(f"{where} is not cached")


def download_checkpoint(repo: str, *, revision: str | None = None, subfolder: str | None = None,
                        files: list[str] | None = None, digests: dict[str, str] | None = None) -> Path:
    """A drafter checkpoint's files in the HF cache; returns the directory that holds them.

    Without ``files``: ``config.json`` and the first of model.safetensors / pytorch_model.bin found.
    """
    def name(f: str) -> str:
        return f"{subfolder.strip('/')}/{f}" if subfolder else f

    digests = digests or {}
    if files:
        paths = [download(repo, name(f), revision=revision, sha256=digests.get(f)) for f in files]
    else:
        paths = [download(repo, name("config.json"), revision=revision)]
        last: LocalspecError | None = None
        for weights in CHECKPOINT_WEIGHTS:
            try:
                paths.append(download(repo, name(weights), revision=revision))
                break
            except LocalspecError as exc:
                last = exc
        else:
            error = FileMissing if isinstance(last, FileMissing) else LocalspecError
            raise error(f"{repo}: no {' or '.join(CHECKPOINT_WEIGHTS)} found ({last})")
    return paths[0].parent


# --------------------------------------------------------------------------------------------
# catalog files under other names (the rules are in localspec.store.repo_files)


def note(text: str) -> None:
    """A ``note: ...`` line on stderr (what pull decided on the user's behalf)."""
    print(f"note: {text}", file=sys.stderr)


def _listing_or_raise(repo: str, revision: str | None, original: LocalspecError) -> list[str]:
    listing = list_files(repo, revision)
    if listing is None:
        raise original
    return listing


def fetch_gguf(repo: str, filename: str, *, parts: list[str] = (), revision: str | None = None,
               sha256: str | None = None, alternatives: list[str] = ()) -> tuple[Path, str]:
    """A GGUF (and the further shards of a split one) from ``repo``: (path of the first, its name).

    When the named file is not in the repository (a stale catalog), the repository's listing is
    read and the file picked by :func:`localspec.store.repo_files.resolve_gguf`; ``pull`` says which.
    """
    try:
        path = download(repo, filename, revision=revision, sha256=sha256)
        for part in parts:   # llama.cpp finds the other parts of a split GGUF next to the first
            download(repo, part, revision=revision)
        return path, filename
    except FileMissing as exc:     # a network failure is reported as it is
        original = exc
    listing = _listing_or_raise(repo, revision, original)
    resolved = repo_files.resolve_gguf(repo, filename, list(parts), listing, list(alternatives))
    if resolved.rule == "as named":
        raise original             # the file is there: the failure was something else
    first, *rest = resolved.files
    note(f"{repo} has no '{filename}'; using '{first}'"
          + (f" and {len(rest)} more shard(s)" if rest else "") + f" ({resolved.rule})"
          + ("; the catalog's sha256 is for the other name and was not checked" if sha256 else ""))
    path = download(repo, first, revision=revision)
    for part in rest:
        download(repo, part, revision=revision)
    return path, first


def fetch_checkpoint(repo: str, files: list[str], *, revision: str | None = None,
                     digests: dict[str, str] | None = None, alternatives: list[str] = ()) -> Path:
    """A drafter checkpoint's ``files`` (config.json + weights); other names when the listing says so."""
    digests = digests or {}
    try:
        return download_checkpoint(repo, revision=revision, files=files, digests=digests)
    except FileMissing as exc:     # a network failure is reported as it is
        original = exc
    listing = _listing_or_raise(repo, revision, original)
    resolved = repo_files.resolve_checkpoint(repo, files, listing, list(alternatives))
    if not resolved.renamed:
        raise original
    kept = {f: digest for f, digest in digests.items() if f in resolved.files}
    dropped = sorted(set(digests) - set(kept))
    note(f"{repo}: {resolved.rule}"
          + (f"; the catalog's sha256 of {', '.join(dropped)} does not apply and was not checked" if dropped else ""))
    return download_checkpoint(repo, revision=revision, files=list(resolved.files), digests=kept)
