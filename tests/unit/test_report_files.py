"""write_report and `pubswap report` on hand-made metrics.jsonl files: the tables (t intervals, n/a for one seed,
paired differences with a seed missing in one arm, the per-run SE column only when the metrics carry it), the
figures (one colour per arm in every figure, no empty figure or panel, bytes from 0, a zero line under the
differences), and report.md never overwritten without force, keeping its title and notes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pubswap_flwr.cli import main as pubswap
from pubswap_flwr.report import ReportExistsError, arm_colours, read_summary, write_report
from pubswap_flwr.report import plots as report_plots

TASKS = ("gcd", "count_bits")


def _eval(accuracy: float, se: bool, samples: int = 4) -> dict:
    out = {"greedy_accuracy": accuracy + 0.05, "sampled_accuracy": accuracy, "sampled_reward": accuracy + 0.1,
           "per_task": {t: {"greedy_accuracy": accuracy + 0.05, "sampled_accuracy": accuracy} for t in TASKS}}
    if se:
        out.update(sampled_accuracy_se=0.012, sampled_reward_se=0.01, samples=samples)
        for task in TASKS:
            out["per_task"][task]["sampled_accuracy_se"] = 0.02
    return out


def make_run(root: Path, arm: str, seed: int, accuracy: float, *, mode: str = "fedavg", rounds: int = 3,
             drift: bool = True, se: bool = False) -> Path:
    """A run directory with rounds 0..rounds; held-out evaluated every round, final sampled accuracy `accuracy`."""
    run = root / "runs" / f"{arm}-s{seed}"
    run.mkdir(parents=True)
    rows, cumulative = [], 0.0
    for rnd in range(rounds + 1):
        row: dict = {"round": rnd, "mode": mode,
                     "eval": _eval(accuracy - 0.01 * (rounds - rnd), se)}
        if rnd > 0:
            reward = 0.3 + 0.01 * rnd + 0.001 * seed
            cumulative += reward
            row.update(train_reward=reward, cumulative_reward=cumulative,
                       clients={"1": {"train_reward": reward - 0.05}, "2": {"train_reward": reward + 0.05}},
                       time={"round_s": 2.0}, bytes={"sent_by_clients": 1_000_000, "received_by_clients": 500_000})
            if drift:
                row["parameter_drift"] = 4.0 - 0.1 * rnd
        rows.append(row)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return run


def _table(text: str, first_cell: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in\n{text}")


@pytest.fixture()
def figures(monkeypatch):
    """Every figure the report saves: {file stem: [(axis, {gid: set of colours})]}."""
    import matplotlib.colors

    seen: dict[str, list] = {}
    original = report_plots.save_figure

    def record(fig, path):
        panels = []
        for axis in fig.axes:
            colours: dict[str, set] = {}
            for artist in list(axis.lines) + list(axis.collections):
                if artist.get_gid():
                    colour = artist.get_color() if hasattr(artist, "get_xdata") else artist.get_facecolor()[0]
                    colours.setdefault(artist.get_gid(), set()).add(matplotlib.colors.to_hex(colour))
            panels.append((axis, colours))
        seen[Path(path).stem] = panels
        return original(fig, path)

    monkeypatch.setattr(report_plots, "save_figure", record)
    return seen


def test_tables_intervals_paired_differences_and_missing_seed(tmp_path):
    runs = [make_run(tmp_path, "base", s, a) for s, a in ((0, 0.20), (1, 0.30), (2, 0.40))]
    runs += [make_run(tmp_path, "treat", s, a) for s, a in ((0, 0.25), (1, 0.40), (3, 0.10))]
    text = write_report(tmp_path, runs).read_text()
    # base: sampled [0.2, 0.3, 0.4] -> 0.3 ± t(0.975, 2) * 0.1 / sqrt(3) = 0.3 ± 0.2484
    cells = _table(text, "base")
    assert cells[1:3] == ["fedavg", "0, 1, 2"]
    assert cells[4] == "0.300 [0.052, 0.548]"
    assert cells[7] == "3" and cells[9] == "4.500 [4.500, 4.500]"  # rounds; 3 rounds x 1.5 MB
    assert "±" not in text
    # treat - base on seeds 0 and 1 only: sampled +0.05, +0.10 -> 0.075 ± 12.706 * 0.025
    assert "## Paired differences against base" in text
    assert "Left out of the pairing (a seed run by only one of the two arms): treat seed(s) 3 (no base run); " \
           "base seed(s) 2 (no treat run)." in text
    row = _table(text, "treat")  # the arms table's row (it comes first)
    # treat's own sampled [0.25, 0.40, 0.10] over 3 seeds: SD 0.15 -> 0.25 ± 4.3027 * 0.15 / sqrt(3) = ± 0.3726
    assert row[4] == "0.250 [-0.123, 0.623]"
    paired = [line for line in text.splitlines() if line.startswith("| treat | sampled acc |")]
    assert paired == ["| treat | sampled acc | +0.050 | +0.100 | +0.075 [-0.243, +0.393] | seeds |"]
    assert "| arm − base | metric | s0 | s1 | mean difference [95% CI] |" in text
    summary = read_summary(tmp_path)
    assert summary["baseline"] == "base"
    assert summary["paired"]["treat"]["seeds"] == [0, 1]
    assert summary["paired"]["treat"]["left_out"] == {"treat": [3], "base": [2]}
    assert summary["paired"]["treat"]["sampled_accuracy"]["mean"] == pytest.approx(0.075)
    assert summary["arms"]["base"]["sampled_accuracy"]["ci_low"] == pytest.approx(0.3 - 0.24841377118)


def test_single_seed_shows_n_a_never_a_zero_spread(tmp_path):
    runs = [make_run(tmp_path, "a", 0, 0.2), make_run(tmp_path, "b", 0, 0.3)]
    text = write_report(tmp_path, runs).read_text()
    cells = _table(text, "a")
    assert cells[3:10] == ["0.250 [n/a]", "0.200 [n/a]", "0.300 [n/a]", "0.960 [n/a]", "3", "6.0", "4.500 [n/a]"]
    assert "| b | sampled acc | +0.100 | +0.100 [n/a] |" in text
    assert "± 0.000" not in text and "±" not in text
    assert read_summary(tmp_path)["arms"]["a"]["sampled_accuracy"]["ci_low"] is None  # JSON null, not NaN


def test_per_run_se_column_only_when_the_metrics_carry_it(tmp_path):
    old = write_report(tmp_path / "old", [make_run(tmp_path / "old", "a", 0, 0.2)]).read_text()
    header = next(line for line in old.splitlines() if line.startswith("| run | seed |"))
    assert "| SE |" not in header and "| n |" not in header
    assert "one T=1 sample per held-out item" in old
    assert "standard error over the task's items" not in old

    new = write_report(tmp_path / "new", [make_run(tmp_path / "new", "a", 0, 0.2, se=True),
                                          make_run(tmp_path / "new", "a", 1, 0.3, se=True)]).read_text()
    header = next(line for line in new.splitlines() if line.startswith("| run | seed |"))
    assert header.startswith("| run | seed | greedy pass@1 | sampled acc | SE | n | sampled reward |")
    assert _table(new, "a-s0")[2:6] == ["0.250", "0.200", "0.012", "4"]
    assert "n = 4 T=1 samples per held-out item" in new
    assert "| a-s1 | 0.300 ± 0.020 | 0.300 ± 0.020 |" in new  # per run and task, with its SE

    mixed = write_report(tmp_path / "mixed", [make_run(tmp_path / "mixed", "a", 0, 0.2, se=True),
                                              make_run(tmp_path / "mixed", "a", 1, 0.3)]).read_text()
    assert _table(mixed, "a-s0")[4:6] == ["0.012", "4"] and _table(mixed, "a-s1")[4:6] == ["–", "–"]


def test_one_colour_per_arm_in_every_figure(tmp_path, figures):
    arms = ["fedavg", "fedprox", "balanced"]
    runs = [make_run(tmp_path, arm, seed, 0.2 + 0.01 * seed, mode="pubswap" if arm == "balanced" else arm)
            for arm in arms for seed in (0, 1)]
    write_report(tmp_path, runs)
    assert {"heldout_accuracy", "reward", "cumulative_reward", "paired_difference", "drift", "bytes"} <= set(figures)
    expected = arm_colours(arms)
    assert len(set(expected.values())) == 3
    used: dict[str, set] = {}
    for name, panels in figures.items():
        for _, colours in panels:
            for arm, found in colours.items():
                used.setdefault(arm, set()).update(found)
    assert used == {arm: {expected[arm]} for arm in arms}  # lines and bands alike, in every panel
    assert "balanced" in {gid for _, colours in figures["drift"] for gid in colours}
    # paired differences: the baseline is the zero line, not a curve
    assert all("fedavg" not in colours for _, colours in figures["paired_difference"])
    # the mapping is by position in the sweep, the same for every report of that sweep
    assert arm_colours(arms) == arm_colours(arms + ["fedavg"]) == expected


def test_no_empty_figure_or_panel(tmp_path, figures):
    runs = [make_run(tmp_path, arm, 0, 0.2, mode="sapo", drift=False) for arm in ("sapo-8-0", "sapo-4-4")]
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "drift.png").write_bytes(b"stale")  # from an older report
    text = write_report(tmp_path, runs).read_text()
    assert "drift" not in figures and not (tmp_path / "plots" / "drift.png").exists()
    assert "plots/drift.png" not in text and "not measured" not in text
    for name, panels in figures.items():
        for axis, colours in panels:
            assert colours, f"{name} has an empty panel"

    other = tmp_path / "partly"
    runs = [make_run(other, "fedavg", 0, 0.2), make_run(other, "sapo", 0, 0.2, mode="sapo", drift=False)]
    write_report(other, runs)
    [(axis, colours)] = figures["drift"]  # policy drift: no arm has it, so no panel
    assert set(colours) == {"fedavg"} and axis.get_title() == "Parameter-space drift"


@pytest.mark.rendered_figures
def test_figures_are_real_pngs_of_the_figures_size_with_integer_round_ticks(tmp_path, figures):
    from PIL import Image

    runs = [make_run(tmp_path, arm, seed, 0.2) for arm in ("a", "b") for seed in (0, 1)]
    write_report(tmp_path, runs)
    assert figures
    for name, panels in figures.items():
        with Image.open(tmp_path / "plots" / f"{name}.png") as image:
            assert image.format == "PNG"
            width, height = panels[0][0].figure.get_size_inches() * 110  # render_png's dpi
            assert image.size == (round(width), round(height)), name
        for axis, _ in panels:
            ticks = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)


def test_bytes_from_zero_and_a_zero_line_under_differences(tmp_path, figures):
    runs = [make_run(tmp_path, arm, seed, 0.2) for arm in ("a", "b") for seed in (0, 1)]
    write_report(tmp_path, runs)
    [(axis, _)] = figures["bytes"]
    assert axis.get_ylim()[0] == 0 and axis.get_ylim()[1] > 1.5
    for axis, _ in figures["paired_difference"]:
        zero = [line for line in axis.lines if not line.get_gid() and set(line.get_ydata()) == {0.0}]
        assert zero, axis.get_title()


def test_report_never_overwritten_without_force_and_keeps_title_and_notes(tmp_path):
    runs = [make_run(tmp_path, "a", 0, 0.2), make_run(tmp_path, "b", 0, 0.3)]
    report = write_report(tmp_path, runs, title="compare-x", notes="Four clients, six rounds.",
                          command="pubswap compare configs/compare-x.toml", force=True)
    first = report.read_text()
    with pytest.raises(ReportExistsError, match="force"):
        write_report(tmp_path, runs, title="other")
    assert report.read_text() == first

    again = write_report(tmp_path, runs, command="pubswap report x/*", force=True).read_text()
    assert again.startswith("# compare-x\n")
    assert "Four clients, six rounds." in again
    assert "Runs made by `pubswap compare configs/compare-x.toml`; this report generated" in again
    assert "by `pubswap report x/*`" in again

    renamed = write_report(tmp_path, runs, title="renamed", notes="", force=True).read_text()
    assert renamed.startswith("# renamed\n") and "Four clients" not in renamed


def test_pubswap_report_cli_force_baseline_and_kept_title(tmp_path, capsys):
    runs = [make_run(tmp_path, arm, seed, 0.2 + 0.1 * i) for i, arm in enumerate(("x", "y", "z"))
            for seed in (0, 1)]
    args = ["report"] + [str(r) for r in runs]
    out = tmp_path / "runs" / "report"  # beside the runs, never the directory the command runs from
    assert pubswap(args + ["--title", "sweep t", "--notes", "kept notes"]) == 0
    first = (out / "report.md").read_text()
    assert f"by `pubswap report {tmp_path / 'runs'}/*`" in first
    assert "## Paired differences against x" in first

    assert pubswap(args) == 1
    assert "exists" in capsys.readouterr().err and (out / "report.md").read_text() == first

    assert pubswap(args + ["--force", "--baseline", "z"]) == 0
    text = (out / "report.md").read_text()
    assert text.startswith("# sweep t\n") and "kept notes" in text
    assert "## Paired differences against z" in text and "| x | sampled acc | -0.200 | -0.200 |" in text
    assert "--baseline z --force" in text

    # the arm order (and so colours and the default baseline) of the previous report survives a glob's order
    assert pubswap(["report"] + list(reversed(args[1:])) + ["--force"]) == 0
    assert read_summary(out)["baseline"] == "z"
    assert list(read_summary(out)["arms"]) == ["x", "y", "z"]
    assert pubswap(args + ["--force", "--baseline", "nope"]) == 2


def test_pubswap_report_writes_into_a_sweeps_own_folder_for_its_runs(tmp_path):
    runs = [make_run(tmp_path, "x", seed, 0.2) for seed in (0, 1)]
    (tmp_path / "outcomes.json").write_text("[]")  # tmp_path is a sweep's folder (pubswap compare's --out)
    assert pubswap(["report"] + [str(r) for r in runs]) == 0
    assert (tmp_path / "report.md").is_file() and not (tmp_path / "runs" / "report").exists()


def test_answer_format_section_counts_client_rounds_below_the_warning(tmp_path):
    plain = write_report(tmp_path / "plain", [make_run(tmp_path / "plain", "a", 0, 0.2)]).read_text()
    assert "## Answer format" not in plain  # runs that did not record well_formed get no section

    runs = []
    for arm, seed, shares in (("a", 0, [(1.0, 0.9), (0.95, 0.85), (0.9, 0.9)]),
                              ("a", 1, [(1.0, 1.0), (0.7, 0.9), (0.5, 0.6)]),
                              ("b", 0, [(1.0, 1.0), (1.0, 1.0), (1.0, 0.8)])):
        run = make_run(tmp_path / "fmt", arm, seed, 0.2)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row, (first, second) in zip(rows[1:], shares):
            row["clients"]["1"]["well_formed"], row["clients"]["2"]["well_formed"] = first, second
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        runs.append(run)
    text = write_report(tmp_path / "fmt", runs).read_text()
    assert "## Answer format" in text
    section = text.split("## Answer format")[1]
    a, b = _table(section, "a"), _table(section, "b")
    # a: last-round means 0.90 (s0) and 0.55 (s1); below 0.8: s1's 0.7, 0.5 and 0.6
    assert a[1:] == ["0.725 (0.550–0.900)", "3 of 12", "1 of 2"]
    assert b[1:] == ["0.900", "0 of 6", "0 of 1"]  # 0.8 is not below the threshold
    summary = json.loads((tmp_path / "fmt" / "summary.json").read_text())
    assert summary["format"]["a"]["client_rounds_below"] == 3 and summary["runs"]["a-s1"]["format_breaks"] == 3


def test_wall_time_is_the_median_and_range_over_seeds_never_a_t_interval(tmp_path):
    runs = []
    for seed, elapsed in enumerate((352.9, 101.2, 1905.4)):  # one slow seed on a loaded machine
        run = make_run(tmp_path, "a", seed, 0.2)
        (run / "status.json").write_text(json.dumps({"status": "completed", "elapsed_s": elapsed}))
        runs.append(run)
    text = write_report(tmp_path, runs).read_text()
    assert "| arm | mode | seeds | greedy pass@1 | sampled acc | sampled reward | cumulative reward | rounds | " \
           "wall time (s), median (range) | MB on the wire |" in text
    assert _table(text, "a")[8] == "352.9 (101.2–1905.4)"
    assert "except wall time: the median over seeds with the range (fastest–slowest)" in text
    wall = read_summary(tmp_path)["arms"]["a"]["wall_s"]
    assert wall == {"median": 352.9, "min": 101.2, "max": 1905.4, "n": 3, "values": [352.9, 101.2, 1905.4]}


def _styles_seen(monkeypatch) -> dict[str, dict]:
    """Every figure the report saves: {file stem: {"suptitle": text, "lines": {gid: {(colour, marker, style)}}}}."""
    import matplotlib.colors

    seen: dict[str, dict] = {}
    original = report_plots.save_figure

    def record(fig, path):
        lines: dict[str, set] = {}
        for axis in fig.axes:
            for line in axis.lines:
                if line.get_gid():
                    lines.setdefault(line.get_gid(), set()).add(
                        (matplotlib.colors.to_hex(line.get_color()), line.get_marker(), line.get_linestyle()))
        title = fig._suptitle.get_text() if fig._suptitle is not None else ""
        seen[Path(path).stem] = {"suptitle": title, "lines": lines}
        return original(fig, path)

    monkeypatch.setattr(report_plots, "save_figure", record)
    return seen


SWEEP_ORDER = ["fedavg", "fedprox", "random", "balanced"]


def test_colours_follow_the_sweep_order_whatever_the_run_order(tmp_path, monkeypatch):
    import random

    runs = [make_run(tmp_path, arm, seed, 0.2 + 0.01 * seed) for arm in SWEEP_ORDER for seed in (0, 1, 2)]
    # a report written before from a shell glob's (alphabetical) order
    write_report(tmp_path, sorted(runs), force=True)
    assert list(read_summary(tmp_path)["arms"]) == ["balanced", "fedavg", "fedprox", "random"]
    expected = report_plots.arm_styles(SWEEP_ORDER)
    seen = _styles_seen(monkeypatch)
    drawn = []
    for shuffle_seed in (1, 2):
        shuffled = list(runs)
        random.Random(shuffle_seed).shuffle(shuffled)
        text = write_report(tmp_path, shuffled, arm_order=SWEEP_ORDER, force=True).read_text()
        summary = read_summary(tmp_path)
        assert list(summary["arms"]) == SWEEP_ORDER and summary["baseline"] == "fedavg"
        assert "Colours and markers are fixed per arm across every figure: fedavg blue circles, fedprox orange " \
               "squares, random green triangles, balanced red diamonds." in text
        for name, figure in seen.items():
            for arm, styles in figure["lines"].items():
                assert {(colour, marker) for colour, marker, _ in styles} == \
                    {(expected[arm].colour, expected[arm].marker)}, name
        drawn.append({name: figure["lines"] for name, figure in seen.items()})
    assert drawn[0] == drawn[1]


def test_publish_orders_arms_as_the_sweep_file_does(tmp_path):
    from tests.unit.test_report_publish import _finished_sweep, _script

    script = _script()
    sweep, results = _finished_sweep(tmp_path)  # arms fedavg, fedprox in the sweep file
    outcomes = json.loads((results / "mini-sweep" / "outcomes.json").read_text())
    (results / "mini-sweep" / "outcomes.json").write_text(json.dumps(outcomes[::-1]))
    published = script.publish(sweep, results, docs=tmp_path / "docs")
    assert list(read_summary(published)["arms"]) == ["fedavg", "fedprox"]
    (published / "summary.json").write_text(json.dumps({**read_summary(published), "arms": {"fedprox": {}}}))
    script.regenerate(sweep, docs=tmp_path / "docs")
    assert list(read_summary(published)["arms"]) == ["fedavg", "fedprox"]


def test_paired_difference_plots_say_what_their_band_is(tmp_path, monkeypatch):
    seen = _styles_seen(monkeypatch)
    runs = [make_run(tmp_path, arm, seed, 0.2 + 0.02 * seed) for arm in ("a", "b") for seed in (0, 1)]
    text = write_report(tmp_path, runs).read_text()
    band = "band: 95% CI of the paired mean difference over seeds (paired t, n-1 df)"
    assert seen["paired_difference"]["suptitle"] == f"Each arm minus a on the same seed, mean over seeds; {band}"
    assert f"each arm minus a on the same seed, mean over seeds ({band})" in text
    single = tmp_path / "one"
    write_report(single, [make_run(single, arm, 0, 0.2) for arm in ("a", "b")])
    assert seen["paired_difference"]["suptitle"].endswith("mean over seeds; one seed: no interval")


def test_arms_that_send_the_same_bytes_stay_distinguishable(tmp_path, monkeypatch):
    seen = _styles_seen(monkeypatch)
    runs = [make_run(tmp_path, arm, seed, 0.2, rounds=40) for arm in SWEEP_ORDER for seed in (0, 1)]
    write_report(tmp_path, runs, arm_order=SWEEP_ORDER)  # every arm: 1.5 MB per round
    lines = seen["bytes"]["lines"]
    assert set(lines) == set(SWEEP_ORDER)
    looks = [(marker, style) for arm in SWEEP_ORDER for _, marker, style in lines[arm]]
    assert len(set(looks)) == len(SWEEP_ORDER)  # each arm its own marker and line style
    assert {style for _, style in looks} == {"-", "--", ":", "-."}


def test_a_null_where_a_number_belongs_is_left_out_not_a_crash(tmp_path):
    runs = [make_run(tmp_path, "a", s, 0.3) for s in (0, 1)] + [make_run(tmp_path, "b", s, 0.4) for s in (0, 1)]
    for run in runs[2:]:  # arm b's files hold nulls (found by test_file_properties' hypothesis search)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows[-1]["cumulative_reward"] = None
        rows[0]["eval"]["greedy_accuracy"] = None
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = write_report(tmp_path, runs).read_text()
    assert _table(text, "b")[6] == "–"  # cumulative reward: not a number
    assert "| b | greedy strict |" not in text and "| a | sampled strict |" in text  # a metric not every run has
