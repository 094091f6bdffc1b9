"""Locating and declaring the fastllm shared library (ctypes)."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

_NAMES = {"linux": "libfastllm.so", "darwin": "libfastllm.dylib", "win32": "fastllm.dll"}


def _candidates() -> list[Path]:
    name = _NAMES.get(sys.platform, "libfastllm.so")
    out: list[Path] = []
    env = os.environ.get("FASTLLM_LIBRARY")
    if env:
        out.append(Path(env))
    here = Path(__file__).resolve().parent
    out.append(here / name)
    # the repository's build output when running from a checkout
    for up in [here.parent.parent.parent, Path.cwd()]:
        for profile in ("release", "debug"):
            out.append(up / "target" / profile / name)
    return out


def load_library() -> ctypes.CDLL:
    """Loads libfastllm: $FASTLLM_LIBRARY, next to this package, or the repo's target/ dir."""
    tried = []
    for p in _candidates():
        tried.append(str(p))
        if p.is_file():
            return ctypes.CDLL(str(p))
    raise OSError(
        "libfastllm not found; build it with `cargo build --release` or set FASTLLM_LIBRARY. Tried: "
        + ", ".join(tried)
    )


class ModelParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("device", ctypes.c_char_p),
        ("threads", ctypes.c_uint32),
        ("low_memory", ctypes.c_bool),
        ("precision", ctypes.c_uint32),
        ("cuda_graphs", ctypes.c_int32),
        ("fused_ops", ctypes.c_int32),
        ("gpu_memory_cap_mb", ctypes.c_int64),
        ("simd", ctypes.c_int32),
        ("cache_dir", ctypes.c_char_p),
        ("kv_dtype", ctypes.c_char_p),
        ("batch_invariant", ctypes.c_int32),
        ("peer_all_reduce", ctypes.c_int32),
    ]


class Sampling(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("repetition_penalty", ctypes.c_float),
        ("presence_penalty", ctypes.c_float),
        ("frequency_penalty", ctypes.c_float),
        ("seed", ctypes.c_uint64),
    ]


class GenerateParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("max_new_tokens", ctypes.c_uint32),
        ("sampling", Sampling),
        ("stop", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop", ctypes.c_size_t),
        ("chat", ctypes.c_bool),
        ("system", ctypes.c_char_p),
    ]


TOKEN_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_char), ctypes.c_size_t)


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Sets argtypes/restype of every exported function."""
    c = ctypes
    P = c.c_void_p
    st = c.c_int
    sig = {
        "fastllm_version": ([], c.c_char_p),
        "fastllm_status_string": ([c.c_int32], c.c_char_p),
        "fastllm_last_error": ([], c.c_char_p),
        "fastllm_model_params_default": ([], ModelParams),
        "fastllm_model_load": ([c.c_char_p, c.POINTER(ModelParams), c.POINTER(P)], st),
        "fastllm_model_free": ([P], None),
        "fastllm_model_vocab_size": ([P], c.c_int32),
        "fastllm_model_context_length": ([P], c.c_int32),
        "fastllm_model_meta": ([P, c.c_char_p, c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)], st),
        "fastllm_tokenize": ([P, c.c_char_p, c.c_size_t, c.c_bool, c.c_bool, c.POINTER(c.c_int32), c.c_size_t, c.POINTER(c.c_size_t)], st),
        "fastllm_detokenize": ([P, c.POINTER(c.c_int32), c.c_size_t, c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)], st),
        "fastllm_session_new": ([P, c.c_uint32, c.POINTER(P)], st),
        "fastllm_session_free": ([P], None),
        "fastllm_session_eval": ([P, c.POINTER(c.c_int32), c.c_size_t], st),
        "fastllm_session_logits": ([P, c.POINTER(c.POINTER(c.c_float)), c.POINTER(c.c_size_t)], st),
        "fastllm_session_length": ([P], c.c_size_t),
        "fastllm_session_reset": ([P], st),
        "fastllm_session_add_message": ([P, c.c_char_p, c.c_char_p], st),
        "fastllm_sampling_default": ([], Sampling),
        "fastllm_session_sample": ([P, c.POINTER(Sampling), c.POINTER(c.c_int32)], st),
        "fastllm_generate_params_default": ([], GenerateParams),
        "fastllm_generate": ([P, c.c_char_p, c.POINTER(GenerateParams), TOKEN_CALLBACK, P, c.POINTER(c.c_void_p)], st),
        "fastllm_string_free": ([c.c_void_p], None),
        "fastllm_data_new": ([c.c_uint32, c.POINTER(c.c_int64), c.c_size_t, c.c_void_p, c.c_size_t, c.POINTER(P)], st),
        "fastllm_data_free": ([P], None),
        "fastllm_data_shape": ([P, c.POINTER(c.c_int64), c.c_size_t, c.POINTER(c.c_size_t)], st),
        "fastllm_data_read": ([P, c.c_void_p, c.c_size_t, c.POINTER(c.c_size_t)], st),
        "fastllm_op_run": ([c.c_char_p, c.POINTER(c.c_char_p), c.POINTER(P), c.c_size_t, c.POINTER(c.c_char_p), c.POINTER(c.c_float), c.c_size_t, c.POINTER(c.c_char_p), c.POINTER(c.c_int32), c.c_size_t], st),
        "fastllm_profiler_report": ([c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)], st),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    return lib
