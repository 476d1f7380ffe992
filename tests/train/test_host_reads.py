"""``HostReads`` against a hand-made reference: small snippets, each known to make the host
wait for the device on a GPU (or known not to), and exactly the reads each one makes,
where (``file:line``), and whether of device or host data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from loomrl.train.host_reads import HostReads

Snippet = Callable[[Tensor, Tensor, Tensor], object]
pytestmark = pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8:UserWarning")

#: (snippet of x (device floats), m (a device bool mask), h (host ints), the reads it makes).
READS: list[tuple[str, Snippet, list[str]]] = [
    ("item", lambda x, m, h: x.sum().item(), ["item"]),
    ("float", lambda x, m, h: float(x[0]), ["float"]),
    ("int", lambda x, m, h: int(x.argmax()), ["int"]),
    ("bool", lambda x, m, h: bool(m.any()), ["bool"]),
    ("if", lambda x, m, h: 1 if (x > 100).all() else 0, ["bool"]),
    ("tolist", lambda x, m, h: x.tolist(), ["tolist"]),
    ("numpy", lambda x, m, h: x.numpy(), ["numpy"]),
    ("print", lambda x, m, h: f"{x.sum():.3f}", ["print"]),
    ("shape from a tensor", lambda x, m, h: torch.zeros(m.sum()), ["item"]),
    ("slice end from a tensor", lambda x, m, h: x[: m.sum()], ["item"]),
    ("mask indexing", lambda x, m, h: x[m], ["index with a bool mask"]),
    ("mask assignment", lambda x, m, h: x.clone().__setitem__(m, 0.0), ["index with a bool mask"]),
    ("uint8 mask", lambda x, m, h: x[m.to(torch.uint8)], ["index with a bool mask"]),
    ("nonzero", lambda x, m, h: m.nonzero(), ["nonzero"]),
    ("where of a condition", lambda x, m, h: torch.where(m), ["nonzero"]),
    ("argwhere", lambda x, m, h: torch.argwhere(m), ["nonzero"]),
    ("masked_select", lambda x, m, h: x.masked_select(m), ["masked_select"]),
    ("unique", lambda x, m, h: torch.unique(x), ["unique"]),
    ("unique_consecutive", lambda x, m, h: torch.unique_consecutive(x), ["unique_consecutive"]),
    ("bincount", lambda x, m, h: torch.bincount(m.long()), ["bincount"]),
    ("repeat_interleave", lambda x, m, h: x.repeat_interleave(m.long()), ["repeat_interleave"]),
    ("histc without a range", lambda x, m, h: torch.histc(x, bins=4), ["histc"]),
    ("equal", lambda x, m, h: torch.equal(x, x), ["equal"]),
    ("allclose", lambda x, m, h: torch.allclose(x, x + 1e-9), ["allclose"]),
    (
        "masked_fill, value on the device",
        lambda x, m, h: x.masked_fill(m, x[0]),
        ["masked_fill with a tensor value"],
    ),
    (
        "index_fill, value on the device",
        lambda x, m, h: x.index_fill(0, h, x[0]),
        ["index_fill with a tensor value"],
    ),
    (
        "linspace to an end on the device",
        lambda x, m, h: torch.linspace(0, x[0], 3),
        ["linspace with tensor ends"],
    ),
    (
        "a tensor of values on the device",
        lambda x, m, h: torch.tensor([x.sum(), x.max()]),
        ["tensor from values", "tensor from values"],
    ),
    (
        "new_tensor of values on the device",
        lambda x, m, h: x.new_tensor([[x[0]]]),
        ["tensor from values"],
    ),
    ("copy to the host", lambda x, m, h: x.cpu(), ["copy to host"]),
    ("derived from device data", lambda x, m, h: (x * 2 + 1).max().item(), ["item"]),
    ("one_hot without num_classes", lambda x, m, h: F.one_hot(m.long()), ["item", "item"]),
]
#: Snippets that read nothing back.
FREE: list[tuple[str, Snippet]] = [
    ("arithmetic and reductions", lambda x, m, h: (x * 2).sum() + x.max()),
    ("where with values", lambda x, m, h: torch.where(m, x, 0.0)),
    ("multiply by a mask", lambda x, m, h: (x * m).sum() / m.sum().clamp(min=1)),
    ("integer indexing", lambda x, m, h: x[h]),
    ("index_add on an index", lambda x, m, h: torch.zeros(3).index_add_(0, h, x[: len(h)])),
    ("scatter_add", lambda x, m, h: torch.zeros(3).scatter_add_(0, h, x[: len(h)])),
    ("masked_fill with a number", lambda x, m, h: x.masked_fill(m, 0.0)),
    ("index_fill with a number", lambda x, m, h: x.index_fill(0, h, 1.0)),
    ("a tensor of numbers", lambda x, m, h: torch.tensor([1.0, 2.0]) + x[:2]),
    ("as_tensor of a tensor (no copy)", lambda x, m, h: torch.as_tensor(x) * 2),
    ("nonzero_static", lambda x, m, h: torch.nonzero_static(m, size=4)),
    (
        "repeat_interleave with output_size",
        lambda x, m, h: x.repeat_interleave(m.long(), output_size=3),
    ),
    ("histc with a range", lambda x, m, h: torch.histc(x, bins=4, min=0, max=8)),
    ("sort and kthvalue", lambda x, m, h: x.sort().values[2] + x.kthvalue(2).values),
    ("dtype change", lambda x, m, h: x.to(torch.float64)),
    ("clamp with a tensor", lambda x, m, h: x.clamp(max=x[0])),
    ("shapes", lambda x, m, h: (x.shape[0], x.numel(), len(m), x.dim())),
    ("a tensor of host data", lambda x, m, h: torch.tensor([1, 2]) + 1),
]


def data() -> tuple[Tensor, Tensor, Tensor]:
    x = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0, 2.0])
    m = torch.tensor([True, False, True, True, False, False])
    h = torch.tensor([0, 2, 1])
    return x, m, h


def here(snippet: Snippet) -> str:
    return f"{Path(__file__).name}:{snippet.__code__.co_firstlineno}"


@pytest.mark.parametrize(("name", "snippet", "expected"), READS, ids=[r[0] for r in READS])
def test_a_read_of_device_data_is_counted_once_where_it_is_made(name, snippet, expected):
    x, m, h = data()
    with HostReads().place(x, m) as reads:
        snippet(x, m, h)
    assert [r.what for r in reads.reads] == expected
    assert all(r.device for r in reads.reads)
    assert {Path(r.site).name for r in reads.reads} == {here(snippet)}


@pytest.mark.parametrize(("name", "snippet"), FREE, ids=[f[0] for f in FREE])
def test_what_keeps_its_sizes_on_the_host_reads_nothing(name, snippet):
    x, m, h = data()
    with HostReads().place(x, m) as reads:
        snippet(x, m, h)
    assert reads.reads == []


@pytest.mark.parametrize(("name", "snippet", "expected"), READS[:8], ids=[r[0] for r in READS[:8]])
def test_the_same_reads_of_host_data_are_counted_apart(name, snippet, expected):
    x, m, h = data()
    with HostReads() as reads:  # nothing placed: all of it is host data
        snippet(x, m, h)
    assert [r.what for r in reads.reads] == expected
    assert not reads.sites and sum(reads.host.values()) == len(expected)


def test_device_data_flows_through_ops_views_and_writes():
    x, m, _ = data()
    host = torch.zeros(6)
    with HostReads().place(x, m) as reads:
        y = x.exp()[1:4]  # an op, then a view: device data
        host.add_(x)  # written with device data: now device data
        copied = x.cpu()  # a copy on the host: host data
        float(y[0]), host.tolist(), copied.tolist(), float(torch.ones(2).sum())
    assert [(r.what, r.device) for r in reads.reads] == [
        ("copy to host", True), ("float", True), ("tolist", True), ("tolist", False),
        ("float", False),
    ]  # fmt: skip


def test_a_copy_from_another_device_to_the_host_is_a_read():
    """A meta tensor stands in for a device's (it has no data: the copy then fails)."""
    elsewhere = torch.empty(3, device="meta")
    copies = (
        lambda: elsewhere.cpu(),
        lambda: elsewhere.to("cpu"),
        lambda: torch.zeros(3).copy_(elsewhere),
    )
    for copy in copies:
        reads = HostReads()
        with pytest.raises(NotImplementedError), reads:
            copy()
        assert [(r.what, r.device) for r in reads.reads] == [("copy to host", True)]


def test_modules_and_optimizers_are_placed_whole():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    with HostReads().place(model, optimizer) as reads:
        float(model.weight.grad.sum())
        float(next(iter(optimizer.state.values()))["exp_avg"].sum())
        float(model(torch.ones(1, 3)).sum().detach())  # host input, device weights
    assert [r.device for r in reads.reads] == [True, True, True]
    with pytest.raises(TypeError, match="tensors, modules and optimizers"):
        HostReads().place("weights")
