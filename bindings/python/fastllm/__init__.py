"""fastllm: Python bindings over the fastllm-rs C ABI (pure ctypes, no compiled extension).

>>> import fastllm
>>> m = fastllm.Model()                      # the default model (SmolLM2-135M-Instruct), fetched once
>>> m.generate("The capital of France is", max_new_tokens=8)
"""

from __future__ import annotations

import ctypes
import queue
import threading
from typing import Iterator, List, Optional, Sequence, Union

from . import _lib
from ._lib import TOKEN_CALLBACK

__all__ = ["FastllmError", "Model", "Session", "ops", "version", "STATUS"]

_L = _lib.declare(_lib.load_library())

#: Status names by code, as in fastllm.h.
STATUS = {
    0: "FASTLLM_OK",
    1: "FASTLLM_ERR_NULL_ARGUMENT",
    2: "FASTLLM_ERR_INVALID_ARGUMENT",
    3: "FASTLLM_ERR_IO",
    4: "FASTLLM_ERR_FORMAT",
    5: "FASTLLM_ERR_UNSUPPORTED",
    6: "FASTLLM_ERR_OUT_OF_MEMORY",
    7: "FASTLLM_ERR_DEVICE",
    8: "FASTLLM_ERR_CONTEXT_FULL",
    9: "FASTLLM_ERR_BUFFER_TOO_SMALL",
    10: "FASTLLM_ERR_CANCELLED",
    11: "FASTLLM_ERR_PANIC",
}
_BUFFER_TOO_SMALL = 9
_CANCELLED = 10


class FastllmError(Exception):
    """A failed call: `.status` is the numeric FastllmStatus, `.status_name` its name."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.status_name = STATUS.get(status, "UNKNOWN")
        self.message = message
        super().__init__(f"{self.status_name}: {message}")


def _check(status: int) -> None:
    if status != 0:
        detail = _L.fastllm_last_error() or b""
        raise FastllmError(status, detail.decode("utf-8", "replace"))


def version() -> str:
    """The library version."""
    return _L.fastllm_version().decode()


def _sampling(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
              presence_penalty=0.0, frequency_penalty=0.0, seed=0) -> _lib.Sampling:
    s = _L.fastllm_sampling_default()
    s.temperature = float(temperature)
    s.top_k = int(top_k)
    s.top_p = float(top_p)
    s.min_p = float(min_p)
    s.repetition_penalty = float(repetition_penalty)
    s.presence_penalty = float(presence_penalty)
    s.frequency_penalty = float(frequency_penalty)
    s.seed = int(seed)
    return s


class Model:
    """A loaded model. Thread-safe: tokenize and create sessions from any thread.

    path: a .flm file, GGUF file or Hugging Face directory; None = the default model.
    device: "cpu", "cuda", "cuda:1", "cuda:0,1" (tensor parallelism over GPUs 0 and 1, needs
    NCCL) or None (best available). threads: 0 = all cores.
    precision: "fast" (int8 activations in quantized matmuls) or "exact".
    kv_dtype: KV cache dtype "f16", "q8_0" or "f32"; None = the device's default
    (f16 in fast precision, else f32). A dtype the device does not store raises, naming it.
    Run-time switches (None: the FASTLLM_* environment variable, else the default; see
    docs/tuning.md): cuda_graphs (replay recorded decode steps on a GPU), fused_ops (fused
    op forms), batch_invariant (on a GPU, each sequence's results independent of its batch;
    slower), peer_all_reduce (a tensor-parallel group sums with its own peer-to-peer kernels
    where its GPUs reach each other's memory; False: NCCL), gpu_memory_cap_mb (0 = no cap), simd ("portable", "avx2" or "avx512": the
    highest level of the CPU kernels), cache_dir.
    """

    def __init__(self, path: Optional[str] = None, device: Optional[str] = None, threads: int = 0,
                 low_memory: bool = False, precision: str = "fast", *,
                 kv_dtype: Optional[str] = None,
                 cuda_graphs: Optional[bool] = None, fused_ops: Optional[bool] = None,
                 batch_invariant: Optional[bool] = None, peer_all_reduce: Optional[bool] = None,
                 gpu_memory_cap_mb: Optional[int] = None, simd: Optional[str] = None,
                 cache_dir: Optional[str] = None):
        if precision not in ("fast", "exact"):
            raise FastllmError(2, f"precision must be 'fast' or 'exact', not {precision!r}")
        if kv_dtype is not None and not isinstance(kv_dtype, str):
            raise FastllmError(2, f"kv_dtype must be a string such as 'f16', not {kv_dtype!r}")
        simd_levels = {"portable": 0, "avx2": 1, "avx512": 2}
        if simd is not None and simd not in simd_levels:
            raise FastllmError(2, f"simd must be one of {sorted(simd_levels)}, not {simd!r}")
        if gpu_memory_cap_mb is not None and int(gpu_memory_cap_mb) < 0:
            raise FastllmError(2, f"gpu_memory_cap_mb must be >= 0, not {gpu_memory_cap_mb!r}")
        p = _L.fastllm_model_params_default()
        self._device = device.encode() if device else None
        self._kv_dtype = kv_dtype.encode() if kv_dtype is not None else None
        p.kv_dtype = self._kv_dtype
        p.device = self._device
        p.threads = int(threads)
        p.low_memory = bool(low_memory)
        p.precision = 0 if precision == "fast" else 1
        if cuda_graphs is not None:
            p.cuda_graphs = 1 if cuda_graphs else 0
        if fused_ops is not None:
            p.fused_ops = 1 if fused_ops else 0
        if batch_invariant is not None:
            p.batch_invariant = 1 if batch_invariant else 0
        if peer_all_reduce is not None:
            p.peer_all_reduce = 1 if peer_all_reduce else 0
        if gpu_memory_cap_mb is not None:
            p.gpu_memory_cap_mb = int(gpu_memory_cap_mb)
        if simd is not None:
            p.simd = simd_levels[simd]
        self._cache_dir = str(cache_dir).encode() if cache_dir is not None else None
        p.cache_dir = self._cache_dir
        h = ctypes.c_void_p()
        _check(_L.fastllm_model_load(path.encode() if path is not None else None, ctypes.byref(p), ctypes.byref(h)))
        self._h = h

    def close(self) -> None:
        """Frees the model (sessions made from it stay usable)."""
        if getattr(self, "_h", None):
            _L.fastllm_model_free(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def vocab_size(self) -> int:
        return _L.fastllm_model_vocab_size(self._h)

    @property
    def context_length(self) -> int:
        return _L.fastllm_model_context_length(self._h)

    def meta(self, key: str) -> str:
        """A metadata value (name, architecture, vocab_size, chat_template, eos_ids, ...)."""
        n = ctypes.c_size_t()
        st = _L.fastllm_model_meta(self._h, key.encode(), None, 0, ctypes.byref(n))
        if st != _BUFFER_TOO_SMALL:
            _check(st)
        buf = ctypes.create_string_buffer(n.value + 1)
        _check(_L.fastllm_model_meta(self._h, key.encode(), buf, len(buf), ctypes.byref(n)))
        return buf.raw[: n.value].decode("utf-8", "replace")

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> List[int]:
        """Token ids of `text`."""
        b = text.encode("utf-8")
        n = ctypes.c_size_t()
        cap = len(b) + 8
        while True:
            arr = (ctypes.c_int32 * cap)()
            st = _L.fastllm_tokenize(self._h, b, len(b), add_special, parse_special, arr, cap, ctypes.byref(n))
            if st == _BUFFER_TOO_SMALL:
                cap = n.value
                continue
            _check(st)
            return list(arr[: n.value])

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids."""
        arr = (ctypes.c_int32 * len(ids))(*ids)
        n = ctypes.c_size_t()
        cap = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            st = _L.fastllm_detokenize(self._h, arr, len(ids), buf, cap, ctypes.byref(n))
            if st == _BUFFER_TOO_SMALL:
                cap = n.value + 1
                continue
            _check(st)
            return buf.raw[: n.value].decode("utf-8", "replace")

    def session(self, max_tokens: int = 0) -> "Session":
        """A new session (one sequence + KV cache) of up to `max_tokens` (0 = context length)."""
        return Session(self, max_tokens)

    def generate(self, prompt: str, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop: Optional[Sequence[str]] = None, chat: bool = False,
                 system: Optional[str] = None, stream: bool = False, **sampling) -> Union[str, Iterator[str]]:
        """Generates a completion in a fresh session: the text, or an iterator of pieces with stream=True."""
        s = self.session()
        kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                  stop=stop, chat=chat, system=system, **sampling)
        if stream:
            return s.generate_stream(prompt, **kw)
        return s.generate(prompt, **kw)

    def chat(self, messages: Sequence[dict], **sampling) -> str:
        """Answers the last user message of `messages` ([{"role": ..., "content": ...}, ...]),
        rendering the whole conversation with the model's chat template."""
        if not messages or messages[-1].get("role") != "user":
            raise FastllmError(2, "messages must end with a user message")
        s = self.session()
        for m in messages[:-1]:
            s.add_message(m["role"], m["content"])
        return s.generate(messages[-1]["content"], chat=True, **sampling)


class Session:
    """One sequence and its KV cache. Use from one thread at a time."""

    def __init__(self, model: Model, max_tokens: int = 0):
        self._model = model
        h = ctypes.c_void_p()
        _check(_L.fastllm_session_new(model._h, int(max_tokens), ctypes.byref(h)))
        self._h = h
        self._sampling = None

    def close(self) -> None:
        if getattr(self, "_h", None):
            _L.fastllm_session_free(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __len__(self) -> int:
        return _L.fastllm_session_length(self._h)

    def eval(self, ids: Sequence[int]) -> None:
        """Appends tokens and computes the next-token logits."""
        arr = (ctypes.c_int32 * len(ids))(*ids)
        _check(_L.fastllm_session_eval(self._h, arr, len(ids)))

    def logits(self):
        """Logits after the last token: a numpy array if numpy is installed, else a list."""
        p = ctypes.POINTER(ctypes.c_float)()
        n = ctypes.c_size_t()
        _check(_L.fastllm_session_logits(self._h, ctypes.byref(p), ctypes.byref(n)))
        try:
            import numpy as np  # type: ignore

            return np.ctypeslib.as_array(p, shape=(n.value,)).copy()
        except ImportError:
            return p[: n.value]

    def sample(self, **sampling) -> int:
        """Samples the next token (temperature, top_k, top_p, min_p, penalties, seed)."""
        s = _sampling(**sampling)
        t = ctypes.c_int32()
        _check(_L.fastllm_session_sample(self._h, ctypes.byref(s), ctypes.byref(t)))
        return t.value

    def reset(self) -> None:
        """Forgets all tokens and chat history."""
        _check(_L.fastllm_session_reset(self._h))

    def _params(self, max_new_tokens, stop, chat, system, sampling):
        gp = _L.fastllm_generate_params_default()
        gp.max_new_tokens = int(max_new_tokens)
        gp.sampling = _sampling(**sampling)
        stops = [s.encode() for s in (stop or [])]
        arr = (ctypes.c_char_p * max(1, len(stops)))(*stops)
        gp.stop = arr
        gp.n_stop = len(stops)
        gp.chat = bool(chat)
        sys_b = system.encode() if system else None
        gp.system = sys_b
        return gp, (arr, stops, sys_b)

    def generate(self, prompt: str, max_new_tokens: int = 128, stop: Optional[Sequence[str]] = None,
                 chat: bool = False, system: Optional[str] = None, on_piece=None, **sampling) -> str:
        """Generates a completion; `on_piece(text)` is called per piece and may return False to stop."""
        gp, keep = self._params(max_new_tokens, stop, chat, system, sampling)
        err: list = []

        def cb(_ud, _tok, piece, n):
            if on_piece is None:
                return True
            try:
                r = on_piece(ctypes.string_at(piece, n).decode("utf-8", "replace"))
                return r is not False
            except BaseException as e:  # never unwind through C
                err.append(e)
                return False

        c_cb = TOKEN_CALLBACK(cb)
        out = ctypes.c_void_p()
        st = _L.fastllm_generate(self._h, prompt.encode("utf-8"), ctypes.byref(gp), c_cb, None, ctypes.byref(out))
        if err:
            raise err[0]
        if st == _CANCELLED:
            return ""
        _check(st)
        try:
            return ctypes.string_at(out.value).decode("utf-8", "replace") if out.value else ""
        finally:
            _L.fastllm_string_free(out)

    def generate_stream(self, prompt: str, **kw) -> Iterator[str]:
        """Like generate, yielding pieces as they are produced (runs generation on a thread)."""
        q: "queue.Queue" = queue.Queue()
        done = object()
        stop_flag = threading.Event()

        def on_piece(text):
            if text:
                q.put(text)
            return not stop_flag.is_set()

        def work():
            try:
                self.generate(prompt, on_piece=on_piece, **kw)
                q.put(done)
            except BaseException as e:
                q.put(e)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop_flag.set()
            t.join()

    def add_message(self, role: str, content: str) -> None:
        """Appends a message to the chat history without generating (for replaying a conversation)."""
        _check(_L.fastllm_session_add_message(self._h, role.encode("utf-8"), content.encode("utf-8")))


from . import ops  # noqa: E402  (needs _L)
