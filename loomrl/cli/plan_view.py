"""The memory plan as a table (``loomrl train --plan``, ``loomrl doctor --config``): a row
per part, a column per device and phase (the rollout phase: the engine generates; the
learning phase: the learner's peak), the totals against each device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loomrl.train.memory_plan import PHASES

if TYPE_CHECKING:
    from loomrl.train.memory_plan import DevicePlan, MemoryPlan


def plan_table(plan: MemoryPlan, title: str = "memory plan") -> Table:
    """Rows per part; identical devices (ranks 1..N-1) share one pair of columns."""
    groups = _groups(plan.devices)
    table = Table(title=title)
    table.add_column("part")  # wraps first: the figures keep their width on a narrow terminal
    for label, _ in groups:
        for phase in PHASES:
            table.add_column(f"{label}\n{phase}", justify="right", min_width=8)
    names = list(dict.fromkeys(p.name for d in plan.devices for p in d.parts))
    for name in names:
        cells = []
        for _, device in groups:
            part = next((p for p in device.parts if p.name == name), None)
            for phase in PHASES:
                cells.append("" if part is None else _gib(part.at(phase)))
        table.add_row(escape(name), *cells)
    table.add_section()
    totals, limits = [], []
    for _, device in groups:
        for phase in PHASES:
            peak = device.peak(phase)
            style = "red" if peak > device.capacity else "green"
            totals.append(f"[{style}]{_gib(peak)}[/]")
            limits.append(_gib(device.capacity))
    table.add_row("[bold]total[/]", *totals)
    table.add_row("of (GPU total, host free)", *limits)
    return table


def print_plan(plan: MemoryPlan, console: Console, title: str = "memory plan") -> None:
    """The table, then the plan's settings, notes and whether it fits (the caller says
    why not: ``plan.refusal``)."""
    console.print(plan_table(plan, title))
    tokens = f"micro_batch_tokens {plan.micro_batch_tokens:,}"
    share = plan.engine_utilization
    engine = "" if share is None else f", engine gpu_memory_utilization {share}"
    console.print(f"colocate {str(plan.colocate).lower()}, {tokens}{engine}", highlight=False)
    for note in plan.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    console.print("[green]fits[/]" if plan.fits else "[red]does not fit[/]")


def _groups(devices: tuple[DevicePlan, ...]) -> list[tuple[str, DevicePlan]]:
    """Consecutive devices with the same parts and size under one label (``cuda:1..3``)."""
    groups: list[tuple[list[str], DevicePlan]] = []
    for device in devices:
        last = groups[-1][1] if groups else None
        same = last is not None and (last.parts, last.memory.total, last.memory.free) == (
            device.parts, device.memory.total, device.memory.free,
        )  # fmt: skip
        if same:
            groups[-1][0].append(device.memory.name)
        else:
            groups.append(([device.memory.name], device))
    labels = []
    for names, device in groups:
        last = names[-1].split(":")[-1].removeprefix("cuda (").removesuffix(")")  # 3, rank 3
        label = names[0] if len(names) == 1 else f"{names[0]}..{last} (each)"
        labels.append((label, device))
    return labels


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size else "-"
