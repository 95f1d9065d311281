"""Savers that write files from native code, handed the path by Python: the audit hook sees no
``open`` of theirs, so each names its file to the watch (``gpusnap/files/watch.py``) before
writing. ``torch.save`` to a path (its zip writer is C++), and safetensors' ``save_file`` (Rust),
which transformers saves weights with. Their files inside a directory the program made are found
at each snapshot anyway; named here, they are also found elsewhere, and a rewrite in place (the
same checkpoint saved again) is known as one."""

from __future__ import annotations

import functools

from gpusnap.onimport import after_import
from gpusnap.files import watch


def _named_by(function, which):
    @functools.wraps(function)
    def saving(*args, **kwargs):
        watch.note_write(which(args, kwargs))
        return function(*args, **kwargs)

    saving.__gpusnap_wrapped__ = function
    return saving


def _torch(module) -> None:
    opener = module._open_zipfile_writer
    if not hasattr(opener, "__gpusnap_wrapped__"):
        module._open_zipfile_writer = _named_by(opener, lambda args, kwargs: args[0] if args else kwargs.get("name_or_buffer"))


def _safetensors(module) -> None:
    serialize = getattr(module, "serialize_file", None)
    if serialize is not None and not hasattr(serialize, "__gpusnap_wrapped__"):
        module.serialize_file = _named_by(serialize, lambda args, kwargs: args[1] if len(args) > 1 else kwargs.get("filename"))


after_import("torch.serialization", _torch)
after_import("safetensors.torch", _safetensors)
after_import("safetensors.numpy", _safetensors)
