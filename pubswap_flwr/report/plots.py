"""The report's figures under plots/: one fixed colour, marker and line style per arm, a 95% CI band over seeds."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Iterable

from ..untrusted import write_replacing
from .curves import PICKS, band, paired_band
from .statistics import Interval
from .summaries import RunSummary

# Every figure a report may write; one no arm has data for is not written (and a stale copy is removed).
PLOT_NAMES = ("heldout_accuracy", "reward", "cumulative_reward", "paired_difference", "drift", "bytes")
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")  # matplotlib's tab10
PALETTE_NAMES = ("blue", "orange", "green", "red", "purple", "brown", "pink", "grey", "olive", "cyan")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
MARKER_NAMES = {"o": "circles", "s": "squares", "^": "triangles", "D": "diamonds", "v": "down triangles",
                "P": "pluses", "X": "crosses", "*": "stars", "<": "left triangles", ">": "right triangles"}
LINESTYLES = ("-", "--", ":", "-.")  # in figures whose arms often draw the same line (bytes per round)
MARKED_POINTS = 12  # markers per curve of a long run, each arm's at other rounds than the others'

Curves = dict[str, tuple[list[int], list[Interval]]]  # arm -> (rounds, interval per round)


def arm_colours(arm_names: Iterable[str]) -> dict[str, str]:
    """A fixed colour per arm by its position in the sweep, used by every panel of every figure."""
    names = list(dict.fromkeys(arm_names))
    if len(names) <= len(PALETTE):
        return {arm: PALETTE[i] for i, arm in enumerate(names)}
    import matplotlib

    cmap = matplotlib.colormaps["turbo"]
    return {arm: matplotlib.colors.to_hex(cmap(i / (len(names) - 1))) for i, arm in enumerate(names)}


def colour_name(colour: str) -> str:
    """A palette colour's name (as the report's text calls it), else the colour itself."""
    return PALETTE_NAMES[PALETTE.index(colour)] if colour in PALETTE else colour


@dataclass(frozen=True)
class ArmStyle:
    """How one arm is drawn in every figure: its colour and marker (and line style where lines coincide); `phase`
    shifts its markers along a long curve so that arms drawing the same line still show each marker."""

    colour: str
    marker: str
    linestyle: str
    phase: float


def arm_styles(arm_names: Iterable[str]) -> dict[str, ArmStyle]:
    """A fixed style per arm by its position in the sweep."""
    names = list(dict.fromkeys(arm_names))
    colours = arm_colours(names)
    return {arm: ArmStyle(colours[arm], MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)],
                          i / max(1, len(names))) for i, arm in enumerate(names)}


def _draw(ax, rounds: list[int], intervals: list[Interval], style: ArmStyle, label: str, gid: str,
          linestyle: str = "-") -> None:
    """The mean curve with the arm's markers (every round of a short run, MARKED_POINTS of a long one), and the 95%
    CI band where at least two seeds give the round a value."""
    means = [iv.mean for iv in intervals]
    step = max(1, math.ceil(len(rounds) / MARKED_POINTS))
    markevery = None if step == 1 else (int(style.phase * step), step)
    ax.plot(rounds, means, color=style.colour, label=label.replace("$", r"\$"),  # a run's name is no mathtext
            linestyle=linestyle, marker=style.marker, markersize=3.5 if step == 1 else 4.5, markevery=markevery,
            gid=gid)
    if any(iv.has_interval for iv in intervals):
        fill = ax.fill_between(rounds, [iv.low for iv in intervals], [iv.high for iv in intervals],
                               color=style.colour, alpha=0.15, linewidth=0)
        fill.set_gid(gid)


def _band_note(arms: dict[str, list[RunSummary]]) -> str:
    seeds = {len(members) for members in arms.values()}
    if seeds == {1}:
        return "one seed per arm: no interval"
    return "band: 95% CI over seeds"


def render_png(fig) -> bytes:
    """The figure in a tight layout as PNG bytes at 110 dpi (laying out and drawing: most of a report's time)."""
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    return png.getvalue()


def save_figure(fig, path: Path) -> Path:
    """Integer round ticks, the PNG (render_png) at `path`; the figure is closed."""
    from matplotlib.ticker import MaxNLocator

    for axis in fig.axes:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    write_replacing(path, render_png(fig))  # a link planted at `path` is replaced, not written through
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


@dataclass
class _Figures:
    """Draws the report's figures into `folder` in the arms' styles, keeping (path, caption) of each written."""

    plt: ModuleType  # matplotlib.pyplot
    folder: Path
    arms: dict[str, list[RunSummary]]
    styles: dict[str, ArmStyle]
    written: list[tuple[Path, str]] = field(default_factory=list)

    def curves(self, key: str) -> Curves:
        found = {arm: band(runs, PICKS[key]) for arm, runs in self.arms.items()}
        return {arm: curve for arm, curve in found.items() if curve[0]}

    # parameters: a figure's presentation options, keyword-only with their defaults
    def figure(self, panels: list[tuple[str, str, str, Curves]], name: str, caption: str, *,
               from_zero: bool = False, sharey: bool = False, zero_line: str | None = None,
               suptitle: str | None = None, arm_linestyles: bool = False) -> None:
        """panels: (title, y label, line style, {arm: curve}); panels without curves are left out. With
        `arm_linestyles` each arm has its own line style (arms that draw the same line stay visible)."""
        panels = [p for p in panels if p[3]]
        if not panels:
            return
        fig, axes = self.plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 0.8, 4.4 if suptitle else 4),
                                      sharey=sharey, squeeze=False)
        if suptitle:
            fig.suptitle(suptitle, fontsize=9)
        for index, (ax, (title, ylabel, linestyle, found)) in enumerate(zip(axes[0], panels)):
            if zero_line is not None:
                ax.axhline(0.0, color="black", linewidth=0.9, linestyle="--", label=zero_line)
            for arm, (rounds, intervals) in found.items():
                _draw(ax, rounds, intervals, self.styles[arm], arm, arm,
                      self.styles[arm].linestyle if arm_linestyles else linestyle)
            ax.set(xlabel="round", ylabel=ylabel, title=title)
            if from_zero:
                top = max(max(iv.high if iv.has_interval else iv.mean for iv in intervals)
                          for _, intervals in found.values())
                ax.set_ylim(0, top * 1.12 if top > 0 else 1)
            ax.grid(alpha=0.25)
            # Colours are fixed per arm, so one legend (in the first panel) serves the figure, unless another
            # panel shows arms the first one lacks.
            if index == 0 or set(found) - set(panels[0][3]):
                ax.legend(fontsize=7)
        self.written.append((save_figure(fig, self.folder / f"{name}.png"), caption))

    def paired_difference(self, baseline: str) -> None:
        """Each arm minus the baseline on the same seed, per round."""
        others = {arm: runs for arm, runs in self.arms.items() if arm != baseline}

        def differences(key: str) -> Curves:
            found = {arm: paired_band(runs, self.arms[baseline], PICKS[key]) for arm, runs in others.items()}
            return {arm: curve for arm, curve in found.items() if curve[0]}

        paired_n = {len({r.seed for r in runs} & {r.seed for r in self.arms[baseline]}) for runs in others.values()}
        diff_note = "one seed: no interval" if paired_n <= {0, 1} else \
            "band: 95% CI of the paired mean difference over seeds (paired t, n-1 df)"
        self.figure([("Held-out sampled accuracy", f"difference to {baseline}", "-", differences("sampled_accuracy")),
                     ("Training reward per round", f"difference to {baseline}", "-", differences("train_reward")),
                     ("Cumulative training reward", f"difference to {baseline}", "-",
                      differences("cumulative_reward"))],
                    "paired_difference", f"each arm minus {baseline} on the same seed, mean over seeds "
                    f"({diff_note}); the dashed line is no difference", zero_line=f"{baseline} (zero)",
                    suptitle=f"Each arm minus {baseline} on the same seed, mean over seeds; {diff_note}")


def write_plots(out: Path, arms: dict[str, list[RunSummary]], baseline: str | None = None,
                styles: dict[str, ArmStyle] | None = None) -> list[tuple[Path, str]]:
    """The report's figures under out/plots/, each with a one-line caption; a figure no arm has data for is
    not written, and a panel no arm has data for is left out of its figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    draw = _Figures(plt, plots, arms, styles or arm_styles(arms))
    note = _band_note(arms)
    draw.figure([(f"Held-out sampled accuracy ({note})", "sampled pass@1", "-", draw.curves("sampled_accuracy")),
                 (f"Held-out greedy pass@1 ({note})", "greedy pass@1", "-", draw.curves("greedy_accuracy"))],
                "heldout_accuracy", "held-out sampled accuracy and greedy pass@1 at each evaluated round, mean over "
                f"seeds ({note})", sharey=True)
    draw.figure([(f"Training reward per round ({note})", "mean reward of the clients' own rollouts", "-",
                  draw.curves("train_reward"))], "reward",
                f"training reward per round (mean over clients of their own rollouts), mean over seeds ({note})")
    draw.figure([(f"Cumulative training reward ({note})", "sum over rounds of the round's reward", "-",
                  draw.curves("cumulative_reward"))], "cumulative_reward",
                f"cumulative training reward (SAPO's headline metric), mean over seeds ({note})")
    if baseline is not None and len(arms) > 1:
        draw.paired_difference(baseline)
    draw.figure([("Parameter-space drift", "mean pairwise L2 of client adapters", "-",
                  draw.curves("parameter_drift")),
                 ("Policy-space drift (public prompts)", "pairwise answer disagreement", "-",
                  draw.curves("policy_disagreement"))],
                "drift", f"client drift per round, mean over seeds ({note}); arms whose mode does not measure it are "
                "absent (SAPO: the server never sees weights; answers to public prompts exist in pubswap mode only)",
                from_zero=True)
    draw.figure([("Bytes on the wire per round", "MB per round (all clients, both ways)", "-",
                  draw.curves("megabytes"))],
                "bytes", f"MB per round, all clients both ways, mean over seeds ({note}); the y axis starts at 0; "
                "arms that send the same bytes draw the same line, so each arm has its own line style and marker",
                from_zero=True, arm_linestyles=True)
    return draw.written


def remove_stale_plots(out: Path, kept: list[tuple[Path, str]]) -> None:
    """A figure this report no longer draws must not linger from an older one."""
    names = {path.stem for path, _ in kept}
    for name in PLOT_NAMES:
        stale = out / "plots" / f"{name}.png"
        if name not in names and stale.is_file():
            stale.unlink()
