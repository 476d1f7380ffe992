"""Host reads: every point where Python waits for a tensor's values, by ``file:line``.

On a GPU each of these makes the host wait until the device has caught up (a "sync"),
and a training step that waits once per micro-batch leaves the GPU idle between them.
``HostReads`` counts them at the ATen dispatch level, so they are counted on the CPU too:

- reads of a value: ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` (``if t:``, a tensor
  as an index or a shape), ``tolist()``, ``numpy()``, printing;
- ops whose output size depends on the data: ``nonzero`` (``torch.where(c)``,
  ``argwhere``), ``masked_select``, indexing or assigning with a bool/uint8 mask
  (``x[mask]``: on the CPU its kernel runs ``nonzero`` *inside* itself, below any mode, so
  it is recognised by its index), ``unique`` / ``unique_consecutive``, ``bincount``,
  ``repeat_interleave`` without ``output_size``, ``histc`` without a range;
- ops that answer with a Python value: ``equal``, ``allclose``, linalg's error checks;
- ops that take a 0-d tensor where the kernel wants a number and read it (``masked_fill``
  and ``index_fill`` with a tensor value, ``linspace`` / ``logspace`` with tensor ends),
  and tensors built from values that are tensors (``torch.tensor([loss, kl])``: one read
  per element);
- device-to-host copies (``.cpu()``; on a real device also ``.to("cpu")`` and ``copy_``
  into a host tensor).

``nonzero_static`` and everything else that keeps its sizes on the host is free. A
``TorchDispatchMode`` sees the ATen ops; a ``TorchFunctionMode`` sees what the CPU never
dispatches (``tolist``, ``numpy``, a ``.cpu()`` that changes nothing) and names Python's
reads (``bool``, ``float``) as such; a read seen by both counts once. Each read is
attributed to the innermost frame outside torch and transformers, so a failing test names
the ``file:line`` that asked.

Device data. A read waits for the device only when its tensor lives there. On a GPU that
is the tensor's device. On the CPU host and device are one, so the counter simulates the
device: ``place`` names what would live on it (models, optimizers, a batch's token
tensors) and every tensor an op computes from device data is device data too. Reads of
device data are in ``sites`` (``total`` of them); reads of host data (a batch's per-sample
lengths, which stay on the host so that micro-batches are planned without waiting) in
``host``: free on a GPU, counted apart. Where the simulation is blind: ``.to(device)`` on
the CPU changes nothing, so host data moved to the device stays host data until device
data flows into it, as does a tensor made on the device from nothing (``torch.zeros(n,
device=d)``); as "the device" is the CPU, only ``.cpu()`` is a copy to the host there
(``.to(device)`` and ``copy_`` into a host tensor are seen on a real device only);
Python-level reads inside a custom ``autograd.Function.backward`` are seen only where they
dispatch (``item``, ``bool``, ``float``: yes; ``tolist`` of a CPU tensor: no); and a
composite op whose CPU path checks values its CUDA path does not (``one_hot``'s range
checks) counts here and not there.

What "per step" means for the learner: the reads of device data in ``Learner.step`` and
``Critic.step`` (forward and backward passes, losses, corrections, metrics, the optimizer)
after the batch is on the device; planning micro-batches and mini-batches from the host
lengths is host data, counted in ``host``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class Read:
    """One host read: ``what`` was read (``"item"``, ``"nonzero"``, ...), at ``site``
    (``file:line``), and whether its tensor was device data (a wait on a GPU)."""

    what: str
    site: str
    device: bool


#: ATen ops that read their inputs back whatever their arguments (by schema name).
ALWAYS: dict[str, str] = {
    "aten::_local_scalar_dense": "item",
    "aten::is_nonzero": "bool",
    "aten::nonzero": "nonzero",
    "aten::masked_select": "masked_select",
    "aten::_unique": "unique",
    "aten::_unique2": "unique",
    "aten::unique_dim": "unique",
    "aten::unique_consecutive": "unique_consecutive",
    "aten::unique_dim_consecutive": "unique_consecutive",
    "aten::bincount": "bincount",
    "aten::equal": "equal",
    "aten::allclose": "allclose",
    "aten::_linalg_check_errors": "linalg error check",
}
#: Indexing ops whose kernel runs ``nonzero`` on a bool/uint8 index.
MASK_INDEXING = frozenset({
    "aten::index", "aten::_unsafe_index", "aten::index_put", "aten::index_put_",
    "aten::_index_put_impl_", "aten::_unsafe_index_put",
})  # fmt: skip
#: Python-level reads, by ``torch.Tensor`` method name.
METHODS: dict[str, str] = {
    "item": "item",
    "tolist": "tolist",
    "numpy": "numpy",
    "__array__": "numpy",
    "__bool__": "bool",
    "__float__": "float",
    "__int__": "int",
    "__index__": "index",
    "__complex__": "complex",
    "__format__": "print",
    "__repr__": "print",
}
HOST_COPY = "copy to host"
FROM_VALUES = "tensor from values"
#: Tensor builders that read back each tensor among their values, with the position of
#: the values among their arguments (``new_tensor``'s first is the tensor it is called on).
_BUILDERS = ((torch.tensor, 0), (torch.as_tensor, 0), (torch.asarray, 0), (Tensor.new_tensor, 1))
#: ATen ops whose kernel reads 0-d tensor arguments as numbers (CUDA too), by schema
#: name: (what the read is called, the overloads that take them (by a part of their
#: name), the arguments' positions).
SCALAR_TENSORS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "aten::masked_fill": ("masked_fill with a tensor value", "Tensor", (2,)),
    "aten::masked_fill_": ("masked_fill with a tensor value", "Tensor", (2,)),
    "aten::index_fill": ("index_fill with a tensor value", "_Tensor", (3,)),
    "aten::index_fill_": ("index_fill with a tensor value", "_Tensor", (3,)),
    "aten::linspace": ("linspace with tensor ends", "Tensor", (0, 1)),
    "aten::logspace": ("logspace with tensor ends", "Tensor", (0, 1)),
}
_LIBRARIES = tuple(importlib.util.find_spec(name) for name in ("torch", "transformers"))
#: Frames a read is not attributed to: the libraries' own and this module's.
_SKIPPED = (
    *(os.path.dirname(s.origin) + os.sep for s in _LIBRARIES if s is not None and s.origin),
    os.path.abspath(__file__),
)


class HostReads:
    """Counts host reads while entered (``with HostReads().place(model, ...) as reads:``):
    ``sites`` (reads of device data) and ``host`` (of host data) by ``"file:line what"``,
    ``total`` the device reads."""

    def __init__(self) -> None:
        self.reads: list[Read] = []
        self._placed: dict[int, weakref.ref[Tensor]] = {}  # simulated device data, by id
        self._inside = 0  # > 0 while a counted read runs: its own inner ops are not reads
        self._stack: contextlib.ExitStack | None = None

    @property
    def sites(self) -> Counter[str]:
        """Reads of device data (each a wait for the device on a GPU), by site."""
        return Counter(f"{r.site} {r.what}" for r in self.reads if r.device)

    @property
    def total(self) -> int:
        """How many reads of device data: the host syncs."""
        return sum(r.device for r in self.reads)

    @property
    def host(self) -> Counter[str]:
        """Reads of host data (free on a GPU), by site."""
        return Counter(f"{r.site} {r.what}" for r in self.reads if not r.device)

    def place(self, *items: Any) -> HostReads:
        """Simulate ``items`` on the device: tensors, modules (parameters, buffers,
        gradients), optimizers (their state) or iterables of these."""
        for tensor in _tensors_of(items):
            self._mark(tensor)
        return self

    def is_device(self, tensor: Tensor) -> bool:
        """Whether ``tensor`` is device data: on a device, or simulated there."""
        if tensor.device.type != "cpu":
            return True
        ref = self._placed.get(id(tensor))
        return ref is not None and ref() is tensor

    def __enter__(self) -> HostReads:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(_Functions(self))
        self._stack.enter_context(_Dispatch(self))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None

    def _mark(self, tensor: Tensor) -> None:
        if tensor.device.type != "cpu":
            return
        for t in (tensor, tensor._base):  # a view's writes land in its base too
            if t is not None and not self.is_device(t):
                key = id(t)
                self._placed[key] = weakref.ref(t, lambda _, key=key: self._placed.pop(key, None))

    def _unmark(self, tensor: Tensor) -> None:
        self._placed.pop(id(tensor), None)

    def _record(self, what: str, device: bool) -> None:
        self.reads.append(Read(what, _site(sys._getframe(1)), device))

    def _counted(self, what: str, device: bool, call: Callable[[], Any]) -> Any:
        """Record one read and run it; reads inside it are the same read."""
        if self._inside:
            return call()
        self._record(what, device)
        self._inside += 1
        try:
            return call()
        finally:
            self._inside -= 1


class _Functions(TorchFunctionMode):
    """Python-level reads: the ones the CPU never dispatches, and names for the rest."""

    def __init__(self, owner: HostReads) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        owner = self.owner
        values = _values_of(func, args, kwargs)
        if values and not owner._inside:  # torch.tensor([t, ...]): each value read back
            for value in values[:-1]:
                owner._record(FROM_VALUES, owner.is_device(value))
            last = owner.is_device(values[-1])
            return owner._counted(FROM_VALUES, last, lambda: func(*args, **kwargs))
        name = getattr(func, "__name__", None)
        tensor = args[0] if args and isinstance(args[0], Tensor) else None
        if tensor is None or name is None or getattr(Tensor, name, None) is not func:
            return func(*args, **kwargs)
        if name in METHODS:
            return owner._counted(
                METHODS[name], owner.is_device(tensor), lambda: func(*args, **kwargs)
            )
        if name == "cpu" and owner.is_device(tensor):
            out = owner._counted(HOST_COPY, True, lambda: func(*args, **kwargs))
            if tensor.device.type == "cpu":  # simulated: the host gets a copy of its own
                out = out.clone() if out is tensor else out
                owner._unmark(out)
            return out
        if name == "to" and tensor.device.type != "cpu" and _to_host(args, kwargs):
            return owner._counted(HOST_COPY, True, lambda: func(*args, **kwargs))
        return func(*args, **kwargs)


class _Dispatch(TorchDispatchMode):
    """ATen-level reads, and device data followed from inputs to outputs."""

    def __init__(self, owner: HostReads) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        owner = self.owner
        read = _reads(func, args, kwargs)
        if read is None:
            out = func(*args, **kwargs)
        else:
            what, tensors = read
            device = any(owner.is_device(t) for t in tensors)
            out = owner._counted(what, device, lambda: func(*args, **kwargs))
        if any(t.device.type == "cpu" and owner.is_device(t) for t in _leaves((args, kwargs))):
            for t in _leaves([out, *_written(func, args, kwargs)]):
                owner._mark(t)
        return out


def _reads(func: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[str, list[Tensor]] | None:
    """What ``func(*args, **kwargs)`` reads back to the host, and from which tensors;
    None for an op that reads nothing."""
    name = func._schema.name

    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in ALWAYS:
        return ALWAYS[name], _leaves((args, kwargs))
    if name in MASK_INDEXING:
        masks = [t for t in _leaves(arg(1, "indices")) if t.dtype in (torch.bool, torch.uint8)]
        return ("index with a bool mask", masks) if masks else None
    overload = func._overloadname
    if name in SCALAR_TENSORS and SCALAR_TENSORS[name][1] in overload:
        what, _, at = SCALAR_TENSORS[name]
        read = [t for i in at if i < len(args) for t in _leaves(args[i])]
        return (what, read) if read else None
    if name == "aten::repeat_interleave" and overload == "Tensor":
        return ("repeat_interleave", [args[0]]) if arg(2, "output_size") is None else None
    if name == "aten::histc":
        return ("histc", [args[0]]) if arg(2, "min", 0) == arg(3, "max", 0) else None
    if name == "aten::_to_copy":  # a real device's copy (a simulated one is seen above it)
        target = kwargs.get("device")
        to_host = target is not None and target.type == "cpu"
        return (HOST_COPY, [args[0]]) if to_host and args[0].device.type != "cpu" else None
    if name in ("aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize"):
        dst, src = (args[0], args[1]) if name == "aten::copy_" else (args[1], args[0])
        return (HOST_COPY, [src]) if dst.device.type == "cpu" and src.device.type != "cpu" else None
    return None


def _values_of(func: Any, args: tuple, kwargs: dict[str, Any]) -> list[Tensor]:
    """The tensors among the values a builder (``torch.tensor([...])``) makes a tensor
    of: each is read back as a number (a tensor given alone is copied, not read)."""
    at = next((i for builder, i in _BUILDERS if func is builder), None)
    if at is None:
        return []
    data = args[at] if len(args) > at else kwargs.get("data", kwargs.get("obj"))
    return [] if isinstance(data, Tensor) else _leaves(data)


def _leaves(values: Any) -> list[Tensor]:
    return [t for t in tree_leaves(values) if isinstance(t, Tensor)]


def _to_host(args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether a ``Tensor.to`` call targets the host."""
    target = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
    return target is not None and target.type == "cpu"


def _written(func: Any, args: tuple, kwargs: dict[str, Any]) -> Iterator[Any]:
    """The arguments ``func`` writes to (in-place and ``out=`` ops)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            yield from tree_leaves(args[i] if i < len(args) else kwargs.get(arg.name))


def _tensors_of(items: Iterable[Any]) -> Iterator[Tensor]:
    for item in items:
        if isinstance(item, Tensor):
            yield item
        elif isinstance(item, torch.nn.Module):
            for t in [*item.parameters(), *item.buffers()]:
                yield t
                if t.grad is not None:
                    yield t.grad
        elif isinstance(item, torch.optim.Optimizer):
            yield from (t for t in tree_leaves(list(item.state.values())) if isinstance(t, Tensor))
        elif isinstance(item, Iterable) and not isinstance(item, str | bytes):
            yield from _tensors_of(item)
        elif item is not None:
            raise TypeError(f"place() takes tensors, modules and optimizers, got {type(item)}")


def _site(frame: FrameType | None) -> str:
    """``file:line`` of the innermost frame outside torch, transformers and this module."""
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    cut = path.rfind(os.sep + "loomrl" + os.sep)
    if cut >= 0:
        path = path[cut + 1 :]
    else:
        with contextlib.suppress(ValueError):  # another drive
            path = os.path.relpath(path)
        path = path if not path.startswith("..") else os.path.basename(path)
    return f"{path}:{frame.f_lineno}"
