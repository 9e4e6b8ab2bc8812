"""The Metrics tab's charts and the Clusters list's utilisation trace, as server-rendered SVG (no
JavaScript, no library): docs/metrics.md, "The Metrics tab".

Pure geometry from `clusters.telemetry.metrics.window`'s series: `window_charts` turns a window
into a
chart per figure for the whole cluster and for each node (the mean of the GPUs as a line, their
lowest and highest as a band around it); `sparkline` turns the list's per-minute trace into
one path. The templates draw them (templates/clusters/tabs/metrics.html, list.html), so the
colours are the stylesheet's classes and follow light and dark mode, as billing/charts.py's
spend chart does, whose axis rounding and ticks these share.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.charts import Tick, nice_ceiling
from clusters.telemetry import metrics
from clusters.telemetry.metrics import GpuNow, GpuPoint, NodeMetrics, Span, TracePoint, Window

WIDTH = 480
HEIGHT = 150
LEFT = 60  # room for the figures on the y axis ("1,000 W")
RIGHT = 10
TOP = 8
BOTTOM = 22  # room for the times
# A gap longer than this many points' time breaks the line: the node did not report meanwhile.
GAP_POINTS = 2.5
# A chart spans at least this much, however young its cluster (a lone report is a dot, not a
# point at both edges), and names its times to the second while it spans less than
# SECONDS_SHOWN.
LEAST_DRAWN = timedelta(minutes=1)
SECONDS_SHOWN = timedelta(minutes=10)
# How each window names itself in a chart's spoken summary.
WINDOW_WORDS = {
    "15m": "the last 15 minutes",
    "1h": "the last hour",
    "24h": "the last 24 hours",
    "7d": "the last 7 days",
}


@dataclass(frozen=True)
class Figure:
    """A charted figure: how a point holds it, its unit, and the least top its axis shows."""

    key: str
    title: str
    unit: str
    span: Callable[[GpuPoint], Span]
    scale: float = 1.0  # stored value × scale = charted value (MiB to GiB)
    floor: float = 1.0  # the axis goes at least this high

    def text(self, value: float | None) -> str:
        if value is None:
            return "—"
        spaced = "" if self.unit in ("%", "°C") else " "
        return f"{value:,.0f}{spaced}{self.unit}"


FIGURES: tuple[Figure, ...] = (
    Figure("utilization", "GPU utilisation", "%", lambda p: p.utilization_percent, floor=100),
    Figure("memory", "GPU memory used", "GiB", lambda p: p.memory_used_mib, 1 / 1024, 8),
    Figure("power", "GPU power", "W", lambda p: p.power_w, floor=100),
    Figure("temperature", "GPU temperature", "°C", lambda p: p.temperature_c, floor=100),
)
FIGURES_BY_KEY = {figure.key: figure for figure in FIGURES}


@dataclass(frozen=True)
class SpanPoint:
    """A figure at one time across some GPUs: the lowest, the mean and the highest."""

    at: datetime
    low: float
    mean: float
    high: float
    samples: int


def combine(
    points: Iterable[GpuPoint], figure: Figure, *, resolution_seconds: int
) -> list[SpanPoint]:
    """The points of many GPUs (of a node, or of every node) as one series: per slot of the
    window's resolution, the lowest min, the mean of the means weighted by their samples and
    the highest max. A GPU that did not have the figure does not count."""
    slots: dict[int, list[tuple[Span, int]]] = {}
    for point in points:
        span = figure.span(point)
        if span.mean is None:
            continue
        slot = int(point.at.timestamp()) // resolution_seconds * resolution_seconds
        slots.setdefault(slot, []).append((span, max(point.samples, 1)))
    series = []
    for slot in sorted(slots):
        spans = slots[slot]
        weight = sum(samples for _, samples in spans)
        mean = sum(span.mean * samples for span, samples in spans if span.mean is not None)
        series.append(
            SpanPoint(
                at=datetime.fromtimestamp(slot, tz=UTC),
                low=min(_part(span, "min") for span, _ in spans) * figure.scale,
                mean=mean / weight * figure.scale,
                high=max(_part(span, "max") for span, _ in spans) * figure.scale,
                samples=weight,
            )
        )
    return series


def _part(span: Span, part: str) -> float:
    """A span's min or max, or its mean where a bucket lacks it."""
    value = getattr(span, part)
    value = span.mean if value is None else value
    assert value is not None  # combine keeps only spans that have a mean
    return float(value)


@dataclass(frozen=True)
class Summary:
    """A figure over the window: its lowest, its mean (weighted by samples), its highest."""

    low: float | None
    mean: float | None
    high: float | None

    @classmethod
    def of(cls, series: Sequence[SpanPoint]) -> Summary:
        if not series:
            return cls(None, None, None)
        weight = sum(point.samples for point in series)
        return cls(
            low=min(point.low for point in series),
            mean=sum(point.mean * point.samples for point in series) / weight,
            high=max(point.high for point in series),
        )


@dataclass(frozen=True)
class TimeTick:
    x: float
    label: str
    anchor: str  # start | middle | end


@dataclass(frozen=True)
class Dot:
    x: float
    y: float


@dataclass(frozen=True)
class LineChart:
    figure: Figure
    width: int
    height: int
    left: int
    plot_right: int
    top: int
    baseline: int
    line: str  # the mean: an SVG path, "" when empty
    band: str  # the lowest to the highest: closed SVG paths
    dots: list[Dot]  # points with no neighbour to draw a line to
    ticks: list[Tick]
    times: list[TimeTick]
    summary: Summary
    latest: float | None
    label: str  # what a screen reader says of the chart

    @property
    def empty(self) -> bool:
        return self.summary.mean is None

    @property
    def latest_text(self) -> str:
        return self.figure.text(self.latest)

    @property
    def low_text(self) -> str:
        return self.figure.text(self.summary.low)

    @property
    def mean_text(self) -> str:
        return self.figure.text(self.summary.mean)

    @property
    def high_text(self) -> str:
        return self.figure.text(self.summary.high)

    @property
    def summary_text(self) -> str:
        figure, summary = self.figure, self.summary
        return (
            f"min {figure.text(summary.low)} · mean {figure.text(summary.mean)} · "
            f"max {figure.text(summary.high)}"
        )


def axis_top(figure: Figure, series: Sequence[SpanPoint], *, limit: float | None = None) -> float:
    """The axis's top: a figure's own limit where it has one (100 %, the GPU's memory), else
    the round value at or above the highest point, never below the figure's floor."""
    if limit:
        return limit
    highest = max((point.high for point in series), default=0.0)
    return float(nice_ceiling(Decimal(str(round(max(highest, figure.floor), 6)))))


def _time_label(at: datetime, window: Window) -> str:
    if window.name == "7d":
        return f"{at:%b} {at.day}"
    # A young cluster's few minutes: the seconds tell its times apart.
    return f"{at:%H:%M:%S}" if window.end - window.start < SECONDS_SHOWN else f"{at:%H:%M}"


def line_chart(
    series: Sequence[SpanPoint],
    *,
    figure: Figure,
    window: Window,
    top: float,
    subject: str,
    latest: float | None = None,
) -> LineChart:
    """One figure's chart over `window`: the mean as a line, the lowest to the highest as a
    band, broken where the points are further apart than the window's resolution allows."""
    plot_width = WIDTH - LEFT - RIGHT
    baseline = HEIGHT - BOTTOM
    plot_height = baseline - TOP
    seconds = max((window.end - window.start).total_seconds(), 1.0)

    def x(at: datetime) -> float:
        share = min(max((at - window.start).total_seconds() / seconds, 0.0), 1.0)
        return round(LEFT + share * plot_width, 2)

    def y(value: float) -> float:
        return round(baseline - min(max(value / top, 0.0), 1.0) * plot_height, 2)

    line, band, dots = [], [], []
    for run in _runs(series, window):
        if len(run) == 1:
            dots.append(Dot(x(run[0].at), y(run[0].mean)))
            continue
        line.append("M" + " L".join(f"{x(p.at)},{y(p.mean)}" for p in run))
        upper = " L".join(f"{x(p.at)},{y(p.high)}" for p in run)
        lower = " L".join(f"{x(p.at)},{y(p.low)}" for p in reversed(run))
        band.append(f"M{upper} L{lower} Z")
    summary = Summary.of(series)
    middle = window.start + (window.end - window.start) / 2
    label = _chart_label(figure, subject, window, summary, latest)
    return LineChart(
        figure=figure,
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        plot_right=WIDTH - RIGHT,
        top=TOP,
        baseline=baseline,
        line=" ".join(line),
        band=" ".join(band),
        dots=dots,
        ticks=[Tick(y=y(top * share), label=figure.text(top * share)) for share in (0, 0.5, 1)],
        times=[
            TimeTick(LEFT, _time_label(window.start, window), "start"),
            TimeTick(LEFT + plot_width / 2, _time_label(middle, window), "middle"),
            TimeTick(WIDTH - RIGHT, _time_label(window.end, window), "end"),
        ],
        summary=summary,
        latest=latest,
        label=label,
    )


def _runs(series: Sequence[SpanPoint], window: Window) -> list[list[SpanPoint]]:
    """The points in runs the line joins: a run breaks where two points are further apart than
    the window's resolution allows (a gap in the reports)."""
    gap = timedelta(seconds=GAP_POINTS * window.resolution_seconds)
    runs: list[list[SpanPoint]] = []
    for point in series:
        if runs and point.at - runs[-1][-1].at <= gap:
            runs[-1].append(point)
        else:
            runs.append([point])
    return runs


def _chart_label(
    figure: Figure, subject: str, window: Window, summary: Summary, latest: float | None
) -> str:
    """What the chart says to a screen reader: its figure, subject and window, and its lowest,
    mean, highest and latest values."""
    words = WINDOW_WORDS.get(window.name, window.name)
    if summary.mean is None:
        return f"{figure.title}, {subject}, {words}: no figures."
    return (
        f"{figure.title}, {subject}, {words}: lowest {figure.text(summary.low)}, "
        f"mean {figure.text(summary.mean)}, highest {figure.text(summary.high)}"
        + (f"; now {figure.text(latest)}." if latest is not None else ".")
    )


# --- a window's charts --------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuRow:
    """A GPU's latest figures as the table beside the charts says them."""

    index: int
    utilization: str
    memory: str  # used of total
    temperature: str
    power: str  # drawn of the limit
    throttle: str  # the active throttle reasons, "none", or "—" (not read)
    throttled: bool  # a slowdown that is the hardware's, not a power cap or idling


# Throttle reasons that mean the GPU is held back by its hardware (shown as a warning).
SLOWDOWNS = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}


def gpu_row(gpu: GpuNow) -> GpuRow:
    utilization, memory, power, temperature = FIGURES
    used = memory.text(gpu.memory_used_mib / 1024 if gpu.memory_used_mib is not None else None)
    total = f"{gpu.memory_total_mib / 1024:,.0f}" if gpu.memory_total_mib else "—"
    limit = f"{gpu.power_limit_w:,.0f}" if gpu.power_limit_w is not None else "—"
    if gpu.throttle is None:
        throttle = "—"
    else:
        throttle = ", ".join(name.replace("_", " ") for name in gpu.throttle) or "none"
    return GpuRow(
        index=gpu.index,
        utilization=utilization.text(gpu.utilization_percent),
        memory=f"{used.removesuffix(' GiB')} of {total} GiB" if used != "—" else "—",
        temperature=temperature.text(gpu.temperature_c),
        power=f"{power.text(gpu.power_w).removesuffix(' W')} of {limit} W"
        if gpu.power_w is not None
        else "—",
        throttle=throttle,
        throttled=bool(set(gpu.throttle or ()) & SLOWDOWNS),
    )


@dataclass(frozen=True)
class NodeCharts:
    metrics: NodeMetrics
    reporting: bool  # its latest report is recent (metrics.reporting)
    charts: list[LineChart]
    utilization: str  # e.g. "8 GPUs · 97%", "" before any report
    gpus: list[GpuRow]  # its latest figures, a row per GPU


@dataclass(frozen=True)
class WindowCharts:
    window: Window
    charts: list[LineChart]  # the whole cluster's, a chart per figure
    nodes: list[NodeCharts]  # the nodes whose detail was asked for

    @property
    def window_words(self) -> str:
        return WINDOW_WORDS.get(self.window.name, self.window.name)

    @property
    def empty(self) -> bool:
        return all(chart.empty for chart in self.charts) and not any(
            node.gpus for node in self.window.nodes
        )


def _latest(figure: Figure, gpus: Sequence[GpuNow]) -> float | None:
    """The mean of the GPUs' figure in their latest report."""
    read = [getattr(gpu, FIGURE_NOW[figure.key]) for gpu in gpus]
    values = [value * figure.scale for value in read if value is not None]
    return sum(values) / len(values) if values else None


# The figure of a GpuNow that a chart's "now" is.
FIGURE_NOW = {
    "utilization": "utilization_percent",
    "memory": "memory_used_mib",
    "power": "power_w",
    "temperature": "temperature_c",
}


def _limit(figure: Figure, gpus: Sequence[GpuNow]) -> float | None:
    """A figure's own top: 100 % for utilisation, the GPUs' memory for memory."""
    if figure.key == "utilization":
        return 100.0
    if figure.key == "memory":
        totals = [gpu.memory_total_mib for gpu in gpus if gpu.memory_total_mib]
        return max(totals) / 1024 if totals else None
    return None


def utilization_text(gpus: int, mean: float | None) -> str:
    """A node's GPUs and their mean utilisation as its row says them: "8 GPUs · 97%"."""
    noun = "GPU" if gpus == 1 else "GPUs"
    return f"{gpus} {noun} · {FIGURES_BY_KEY['utilization'].text(mean)}"


def drawn_from(window: Window, since: datetime | None) -> Window:
    """`window` as its charts span it: from `since` (the cluster's figures begin then: a young
    cluster's few minutes fill the chart) when that is later than its start, and at least
    LEAST_DRAWN."""
    if since is None:
        return window
    start = max(window.start, min(since, window.end - LEAST_DRAWN))
    return replace(window, start=start)


def window_charts(window: Window, *, detail: Collection[str] | None = None) -> WindowCharts:
    """The whole cluster's charts (every GPU of every node) over `window`, and those of the
    nodes named in `detail` (every node's when None)."""
    every_gpu = [gpu for node in window.nodes for gpu in node.gpus]
    every_point = [point for node in window.nodes for point in node.series]
    charts = [
        _chart(figure, every_point, every_gpu, window, subject="every GPU of the cluster")
        for figure in FIGURES
    ]
    nodes = []
    for node in window.nodes:
        if detail is not None and node.node.name not in detail:
            continue
        utilization = _latest(FIGURES_BY_KEY["utilization"], node.gpus)
        nodes.append(
            NodeCharts(
                metrics=node,
                reporting=metrics.reporting(node.reported_at, now=window.end),
                charts=[
                    _chart(figure, node.series, node.gpus, window, subject=node.node.name)
                    for figure in FIGURES
                ],
                utilization=utilization_text(len(node.gpus), utilization) if node.gpus else "",
                gpus=[gpu_row(gpu) for gpu in node.gpus],
            )
        )
    return WindowCharts(window=window, charts=charts, nodes=nodes)


def _chart(
    figure: Figure,
    points: Sequence[GpuPoint],
    gpus: Sequence[GpuNow],
    window: Window,
    *,
    subject: str,
) -> LineChart:
    series = combine(points, figure, resolution_seconds=window.resolution_seconds)
    top = axis_top(figure, series, limit=_limit(figure, gpus))
    latest = _latest(figure, gpus)
    return line_chart(series, figure=figure, window=window, top=top, subject=subject, latest=latest)


# --- the Clusters list's trace ------------------------------------------------------------------

SPARK_WIDTH = 72
SPARK_HEIGHT = 22
SPARK_PAD = 2


@dataclass(frozen=True)
class Sparkline:
    width: int
    height: int
    path: str
    latest: float
    low: float
    high: float

    @property
    def label(self) -> str:
        text = FIGURES_BY_KEY["utilization"].text
        return (
            f"Mean GPU utilisation over the last hour: {text(self.low)} to {text(self.high)}, "
            f"{text(self.latest)} in the latest minute."
        )


def sparkline(points: Sequence[TracePoint], *, now: datetime) -> Sparkline | None:
    """The list's trace of one cluster: its per-minute mean utilisation over the hour to `now`
    on a 0–100 % scale, or None without a point."""
    if not points:
        return None
    start = now - timedelta(hours=1)
    inner = SPARK_HEIGHT - 2 * SPARK_PAD

    def x(at: datetime) -> float:
        share = min(max((at - start).total_seconds() / 3600, 0.0), 1.0)
        return round(SPARK_PAD + share * (SPARK_WIDTH - 2 * SPARK_PAD), 2)

    def y(percent: float) -> float:
        return round(SPARK_PAD + inner - min(max(percent, 0.0), 100.0) / 100 * inner, 2)

    coordinates = [f"{x(p.at)},{y(p.percent)}" for p in points]
    if len(coordinates) == 1:  # a lone minute: a short level stroke, so it shows
        left = x(points[0].at)
        coordinates = [f"{max(left - 3, 0)},{y(points[0].percent)}", coordinates[0]]
    return Sparkline(
        width=SPARK_WIDTH,
        height=SPARK_HEIGHT,
        path="M" + " L".join(coordinates),
        latest=points[-1].percent,
        low=min(p.percent for p in points),
        high=max(p.percent for p in points),
    )
