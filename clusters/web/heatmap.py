"""The Metrics tab's cluster view (issue 37, item 7; docs/metrics.md, "The cluster view"): one
cell per GPU of every live node, for utilisation, memory and temperature, from each node's
latest report, as server-rendered SVG geometry, and the nodes that stand out named in words
(the busiest, the hottest, the idle and the silent ones).

Pure arithmetic on `clusters.telemetry.metrics.window`'s latest figures: no query. The template
(templates/clusters/tabs/metrics.html) draws it; each cell's colour is a stylesheet class (a
level of five, and one for a figure the GPU did not report), and each cell's value is its
`<title>` and a row of the table beside it, so nothing is said by colour alone.
"""

from __future__ import annotations

import bisect
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from operator import attrgetter

from django.conf import settings
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from clusters.telemetry import metrics
from clusters.telemetry.metrics import GpuNow, NodeMetrics, Window

# A cell's pitch (its size and the gap after it) across and down, in the SVG's units: the
# nodes are columns, the GPUs rows, so a 64-node, 8-GPU cluster is one short, wide strip.
ROW_PITCH = 13
GAP = 2
LEFT = 50  # room for "GPU 7"
BOTTOM = 16  # room for the nodes' numbers
# The grid's width in SVG units for any node count: a small cluster's cells are wider.
GRID_WIDTH = 960
MAX_COLUMN_PITCH = 48
# How many of the busiest and hottest nodes are named, and at most how many idle ones.
NAMED = 3
NAMED_IDLE = 8
LEVELS = 5
# A cell's title (its figure in words). The page's script fills the same words when a poll
# sends only the figures (`figures_now`; static/js/app.js), so they have this one home.
CELL_TITLE = "{node} GPU {gpu}: {figure}{since}"


@dataclass(frozen=True)
class HeatFigure:
    """A figure a heatmap shows: how a GPU holds it, its words, and its level of five."""

    key: str
    title: str
    value: Callable[[GpuNow], float | None]  # the figure a level is judged on
    text: Callable[[GpuNow], str]  # the figure as a cell's title and table say it
    bounds: tuple[float, ...]  # the lower bounds of levels 1 to 4
    legend: tuple[str, ...]  # what each level means, in words
    reads: tuple[str, ...]  # the GpuNow fields `value` and `text` are made of, and only these


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}%"


def _memory_share(gpu: GpuNow) -> float | None:
    if gpu.memory_used_mib is None or not gpu.memory_total_mib:
        return None
    return 100 * gpu.memory_used_mib / gpu.memory_total_mib


def _memory_text(gpu: GpuNow) -> str:
    if gpu.memory_used_mib is None:
        return "—"
    used = f"{gpu.memory_used_mib / 1024:,.0f}"
    if not gpu.memory_total_mib:
        return f"{used} GiB"
    return f"{used} of {gpu.memory_total_mib / 1024:,.0f} GiB"


def _temperature_text(gpu: GpuNow) -> str:
    return "—" if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"


HEAT_FIGURES: tuple[HeatFigure, ...] = (
    HeatFigure(
        "utilization",
        "GPU utilisation",
        lambda gpu: gpu.utilization_percent,
        lambda gpu: _percent(gpu.utilization_percent),
        (20, 40, 60, 80),
        ("under 20%", "20–39%", "40–59%", "60–79%", "80% or more"),
        ("utilization_percent",),
    ),
    HeatFigure(
        "memory",
        "GPU memory used",
        _memory_share,
        _memory_text,
        (20, 40, 60, 80),
        ("under 20%", "20–39%", "40–59%", "60–79%", "80% or more"),
        ("memory_used_mib", "memory_total_mib"),
    ),
    HeatFigure(
        "temperature",
        "GPU temperature",
        lambda gpu: gpu.temperature_c,
        _temperature_text,
        (45, 60, 70, 80),
        ("under 45°C", "45–59°C", "60–69°C", "70–79°C", "80°C or more"),
        ("temperature_c",),
    ),
)


# The GPU figures the heatmaps are made of, which the named nodes' (utilisation and
# temperature) are among: all a poll reads of each GPU where no node is picked
# (`metrics.latest`'s columns).
HEAT_READS = tuple(dict.fromkeys(read for figure in HEAT_FIGURES for read in figure.reads))


def level(value: float | None, bounds: Sequence[float]) -> int | None:
    """A figure's level, 0 to 4 (None: not reported)."""
    if value is None:
        return None
    return bisect.bisect_right(bounds, value)  # the bounds it reaches (they ascend)


@dataclass(frozen=True)
class Cell:
    x: float
    y: float
    level: int | None  # 0 to 4, None where the GPU did not report the figure
    title: str  # "node-3 GPU 5: 97%"
    silent: bool  # its node stopped reporting: these are its last figures, outlined

    @property
    def css_class(self) -> str:
        return css_class(self.level, silent=self.silent)


def css_class(level: int | None, *, silent: bool) -> str:
    """A cell's stylesheet class: its shade (one of five levels, or none reported), outlined
    when its node is silent."""
    shade = "heat-none" if level is None else f"heat-l{level}"
    return f"{shade} heat-silent" if silent else shade


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True)
class Heatmap:
    figure: HeatFigure
    width: int
    height: int
    cell_width: float
    cell_height: float
    cells: list[Cell]
    rows: list[Label]  # "GPU 0" … on the left
    columns: list[Label]  # the nodes' numbers under the grid (every few where they are many)
    legend: list[tuple[int, str]]  # (level, its words)
    label: str  # what a screen reader hears of the picture
    silent: bool  # some cells are a silent node's last figures

    @property
    def cells_markup(self) -> SafeString:
        """The cells as SVG, joined here rather than by the template: 1,536 cells at 64 nodes
        × 8 GPUs × 3 figures are the page's largest loop, and a template renders each of their
        five values through its filters (issue 38: the page and its poll at 64 nodes). Every
        value is escaped (the title names a node)."""
        width, height = self.cell_width, self.cell_height
        return format_html_join(
            "",
            '<rect class="{}" x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>',
            (
                (
                    c.css_class,
                    c.x,
                    c.y,
                    width,
                    height,
                    c.title,
                )
                for c in self.cells
            ),
        )


@dataclass(frozen=True)
class Named:
    """A node the words name, with its figure ("99%", "84°C on GPU 3")."""

    name: str
    figure: str


@dataclass(frozen=True)
class NodeFigures:
    """A node's row of the table beside the heatmaps: each GPU's three figures."""

    name: str
    reported: bool
    gpus: list[tuple[int, str, str, str]]  # (index, utilisation, memory, temperature)


@dataclass(frozen=True)
class ClusterView:
    heatmaps: list[Heatmap]
    busiest: list[Named]
    hottest: list[Named]
    idle: list[Named]
    idle_more: int  # idle nodes past the NAMED_IDLE named
    silent: list[str]  # live nodes with no recent report
    idle_percent: str  # the idle rule's threshold, "5%"
    gpu_columns: list[int]  # the table's GPU columns
    rows: list[NodeFigures]
    grid: str  # what the cells are drawn of (`grid_key`): a poll sends figures alone while it holds


def cluster_view(window: Window, *, cells: bool = True) -> ClusterView:
    """The cluster view of `window`'s latest figures: three heatmaps, the named nodes and the
    table of every GPU's figures; without `cells`, the named nodes alone (a poll that sends
    the figures as `figures_now`)."""
    nodes = window.nodes
    gpu_count = max((gpu.index + 1 for node in nodes for gpu in node.gpus), default=0)
    reporting = [n for n in nodes if metrics.reporting(n.reported_at, now=window.end) and n.gpus]
    busiest, hottest, idle = _named(reporting)
    heard = {id(n) for n in reporting}
    silent = {n.node.name for n in nodes if id(n) not in heard}
    return ClusterView(
        heatmaps=[heatmap(figure, nodes, gpu_count, silent=silent) for figure in HEAT_FIGURES]
        if cells
        else [],
        busiest=busiest,
        hottest=hottest,
        idle=idle[:NAMED_IDLE],
        idle_more=max(len(idle) - NAMED_IDLE, 0),
        silent=[n.node.name for n in nodes if n.node.name in silent],
        idle_percent=_percent(settings.RUNCRATE_IDLE_GPU_PERCENT),
        gpu_columns=list(range(gpu_count)),
        rows=[_row(node, gpu_count) for node in nodes] if cells else [],
        grid=grid_key(nodes, gpu_count),
    )


def grid_key(nodes: Sequence[NodeMetrics], gpu_count: int) -> str:
    """What the heatmaps and the table are drawn of, short: the nodes, the GPUs each reported
    and the rows. While it holds, a poll can send the figures alone (`figures_now`), each in
    the place the page already has; a node falling silent only changes figures (its cells'
    outline and words, the legend's silent entry, which the page holds hidden until then)."""
    shape = [(n.node.name, [g.index for g in n.gpus]) for n in nodes]
    return f"{zlib.crc32(repr((gpu_count, shape)).encode()):08x}"


def figures_now(window: Window, view: ClusterView) -> dict:
    """The latest figures as the page's script draws them into the cells it has (issue 38: a
    moved poll at 64 × 8 GPUs sends these, not the panel), compact: each figure's words once
    (`words`: per figure, each distinct (level, text) it has now), and per node in the page's
    order its name, its "silent since", whether it is silent (which row of `classes` its
    cells take) and per GPU its index and, per figure, the key of its words. The cell's class
    is `classes[silent][level]` (level 5: not reported), its title CELL_TITLE of the text;
    the table says the texts. A node with no report is null: its outlines stand. Every class
    and word is this module's; the script looks them up."""
    silent = set(view.silent)
    reported = [node for node in window.nodes if node.gpus]
    every = [gpu for node in reported for gpu in node.gpus]
    said = [_said(figure, every) for figure in HEAT_FIGURES]  # (words, a key per GPU)
    keys = zip(*(found for _, found in said), strict=True)  # per GPU, its figures' keys
    since_of: dict = {}  # a silent node's words, once per time: they report together
    nodes: list[list] = []
    for node in window.nodes:
        name = node.node.name
        if not node.gpus:
            nodes.append([name, "", 0, None])
            continue
        quiet = name in silent
        if quiet and node.reported_at not in since_of:
            since_of[node.reported_at] = _since(node)
        gpus = [[gpu.index, *next(keys)] for gpu in node.gpus]
        nodes.append([name, since_of[node.reported_at] if quiet else "", int(quiet), gpus])
    return {
        "grid": view.grid,
        "title": CELL_TITLE,
        "rows": len(view.gpu_columns),  # the cells of a node with no report: one a row
        "silent": bool(silent),  # the legends' silent entry shows
        "labels": [
            _counted_words(figure, words, found)
            for figure, (words, found) in zip(HEAT_FIGURES, said, strict=True)
        ],
        # A cell's class by its node's silence, then its level (LEVELS: not reported).
        "classes": [
            [css_class(found, silent=quiet) for found in (*range(LEVELS), None)]
            for quiet in (False, True)
        ],
        "words": [words for words, _ in said],
        "nodes": nodes,
    }


def _said(figure: HeatFigure, gpus: Sequence[GpuNow]) -> tuple[list[tuple[int, str]], list[int]]:
    """`figure`'s distinct (level, text) pairs among `gpus`, in the order first met (LEVELS:
    not reported), and each GPU's key into them: a GPU's figure is looked up by the columns
    it is made of (`reads`), not worked out again for each GPU that has the same."""
    read = attrgetter(*figure.reads)
    known: dict = {}
    words: list[tuple[int, str]] = []
    for gpu in gpus:
        raw = read(gpu)
        if raw not in known:
            known[raw] = len(words)
            found = level(figure.value(gpu), figure.bounds)
            words.append((LEVELS if found is None else found, figure.text(gpu)))
    return words, [known[read(gpu)] for gpu in gpus]


def _counted_words(figure: HeatFigure, words: Sequence[tuple[int, str]], keys: list[int]) -> str:
    """A heatmap's spoken words, of the GPUs (their `keys` into `words`) at each level."""
    at = [0] * (LEVELS + 1)
    for key, count in Counter(keys).items():
        at[words[key][0]] += count
    return _words(figure, at[:LEVELS], at[LEVELS])


def _mean(values: Sequence[float | None]) -> float | None:
    read = [value for value in values if value is not None]
    return sum(read) / len(read) if read else None


def _named(nodes: Sequence[NodeMetrics]) -> tuple[list[Named], list[Named], list[Named]]:
    """The busiest nodes (the highest mean utilisation now), the hottest (the hottest GPU)
    and the idle ones (every GPU under the idle notice's threshold), of the reporting nodes;
    ties in node order."""
    means = [(node, _mean([g.utilization_percent for g in node.gpus])) for node in nodes]
    by_use = sorted(
        ((node, mean) for node, mean in means if mean is not None),
        key=lambda pair: (-pair[1], pair[0].node.index),
    )
    busiest = [Named(node.node.name, _percent(mean)) for node, mean in by_use[:NAMED]]
    hot = []
    for node in nodes:
        read = [g for g in node.gpus if g.temperature_c is not None]
        if read:
            gpu = max(read, key=lambda g: (g.temperature_c, -g.index))
            hot.append((node, gpu))
    hot.sort(key=lambda pair: (-(pair[1].temperature_c or 0), pair[0].node.index))
    hottest = [
        Named(node.node.name, f"{_temperature_text(gpu)} on GPU {gpu.index}")
        for node, gpu in hot[:NAMED]
    ]
    threshold = settings.RUNCRATE_IDLE_GPU_PERCENT
    idle = [
        Named(node.node.name, _percent(mean))
        for node, mean in means
        if mean is not None
        and all(
            g.utilization_percent is not None and g.utilization_percent < threshold
            for g in node.gpus
        )
    ]
    return busiest, hottest, idle


def heatmap(
    figure: HeatFigure,
    nodes: Sequence[NodeMetrics],
    gpu_count: int,
    *,
    silent: Collection[str] = (),
) -> Heatmap:
    """One figure's grid: a column per node, a row per GPU index; the cells of the nodes in
    `silent` (no recent report) are their last figures, outlined and said so."""
    columns = max(len(nodes), 1)
    pitch = min(GRID_WIDTH / columns, MAX_COLUMN_PITCH)
    cell_width = round(max(pitch - GAP, 1.0), 2)
    cells = [
        cell
        for column, node in enumerate(nodes)
        for cell in _column(
            figure, node, x=round(LEFT + column * pitch, 2), rows=gpu_count, silent=silent
        )
    ]
    rows_height = max(gpu_count, 1) * ROW_PITCH
    every = 1 if columns <= 16 else 8
    return Heatmap(
        figure=figure,
        width=round(LEFT + columns * pitch),
        height=rows_height + BOTTOM,
        cell_width=cell_width,
        cell_height=ROW_PITCH - GAP,
        cells=cells,
        rows=[
            Label(LEFT - 6, index * ROW_PITCH + (ROW_PITCH - GAP) / 2, f"GPU {index}")
            for index in range(gpu_count)
        ],
        columns=[
            Label(round(LEFT + column * pitch + cell_width / 2, 2), rows_height + 11, str(node))
            for column, node in enumerate(n.node.index for n in nodes)
            if column % every == 0
        ],
        legend=list(enumerate(figure.legend)),
        label=_label(figure, nodes),
        silent=any(cell.silent for cell in cells),
    )


def _column(
    figure: HeatFigure, node: NodeMetrics, *, x: float, rows: int, silent: Collection[str]
) -> list[Cell]:
    """A node's cells: one per GPU, its last figures outlined when the node is silent, or
    every row an outline without a report in the raw hour."""
    name = node.node.name
    if not node.gpus:
        return [
            Cell(x, i * ROW_PITCH, None, f"{name} GPU {i}: no report in the last hour", False)
            for i in range(rows)
        ]
    quiet = name in silent
    since = _since(node) if quiet else ""
    return [
        Cell(
            x=x,
            y=gpu.index * ROW_PITCH,
            level=level(figure.value(gpu), figure.bounds),
            title=CELL_TITLE.format(node=name, gpu=gpu.index, figure=figure.text(gpu), since=since),
            silent=quiet,
        )
        for gpu in node.gpus
    ]


def _since(node: NodeMetrics) -> str:
    """What a silent node's cells add to their title: since when it is silent."""
    return f" (silent since {node.reported_at:%H:%M} UTC)" if node.reported_at else ""


def _label(figure: HeatFigure, nodes: Sequence[NodeMetrics]) -> str:
    """The picture's words: what it shows and how many GPUs are at each level."""
    counts = [0] * LEVELS
    missing = 0
    for node in nodes:
        for gpu in node.gpus:
            found = level(figure.value(gpu), figure.bounds)
            if found is None:
                missing += 1
            else:
                counts[found] += 1
    return _words(figure, counts, missing)


def _words(figure: HeatFigure, counts: Sequence[int], missing: int) -> str:
    """The picture's words, of the GPUs at each level and those that did not report it."""
    levels = zip(counts, figure.legend, strict=True)
    parts = [f"{words}: {count} GPU{'' if count == 1 else 's'}" for count, words in levels if count]
    if missing:
        parts.append(f"not reported: {missing}")
    what = "; ".join(parts) if parts else "no GPU reported"
    return (
        f"{figure.title} of each GPU now, a column per machine, a row per GPU: {what}. "
        "The table of every GPU's figures follows."
    )


def _row(node: NodeMetrics, gpu_count: int) -> NodeFigures:
    by_index = {gpu.index: gpu for gpu in node.gpus}
    utilization, memory, temperature = HEAT_FIGURES
    gpus = []
    for index in range(gpu_count):
        gpu = by_index.get(index)
        if gpu is None:
            gpus.append((index, "—", "—", "—"))
        else:
            gpus.append((index, utilization.text(gpu), memory.text(gpu), temperature.text(gpu)))
    return NodeFigures(name=node.node.name, reported=bool(node.gpus), gpus=gpus)
