"""The report of tools/bench-compare: medians and ratios per cell, results.md, chart.png.

Apart from the runner so that each file holds one job (tests/bench/test_bench_compare.py
reaches these through the runner, which imports them).
"""
import statistics

# What the soak's RESULT line adds (bench/workloads/soak.cpp), reported as medians.
SOAK_FIELDS = ("rss_live_2nd_half", "worst_phase", "rss_before_kb", "rss_idle_kb",
               "idle_delta_kb")


def summarize(runs, workloads, allocator_names, baseline):
    """{workload: {allocator: cell}}; a cell has the medians, spread and ratios to baseline,
    or only 'failed' when any of its runs failed."""
    summary = {}
    for workload in workloads:
        row = {}
        for name in allocator_names:
            cell_runs = [r for r in runs if r.workload == workload and r.allocator == name]
            if not cell_runs or any(r.error for r in cell_runs):
                row[name] = {"failed": sum(1 for r in cell_runs if r.error)}
                continue
            seconds = [r.seconds for r in cell_runs]
            cell = {
                "runs": len(cell_runs),
                "median_seconds": statistics.median(seconds),
                "min_seconds": min(seconds),
                "max_seconds": max(seconds),
                "median_cpu_seconds": statistics.median(r.cpu_seconds for r in cell_runs),
                "median_peak_rss_kb": statistics.median(r.peak_rss_kb for r in cell_runs),
            }
            live = [int(r.fields["peak_live_kb"]) for r in cell_runs if "peak_live_kb" in r.fields]
            if live:
                cell["median_peak_live_kb"] = statistics.median(live)
            for key in SOAK_FIELDS:
                values = [float(r.fields[key]) for r in cell_runs if key in r.fields]
                if values:
                    cell[f"median_{key}"] = statistics.median(values)
            row[name] = cell
        base = row.get(baseline, {})
        for cell in row.values():
            if "failed" in cell or "failed" in base or not base:
                continue
            cell["seconds_ratio"] = cell["median_seconds"] / base["median_seconds"]
            cell["cpu_ratio"] = cell["median_cpu_seconds"] / base["median_cpu_seconds"]
            cell["rss_ratio"] = cell["median_peak_rss_kb"] / base["median_peak_rss_kb"]
        summary[workload] = row
    return summary


def format_cell(value, unit_format, ratio):
    text = unit_format(value)
    return text if ratio is None else f"{text} ({ratio:.2f}×)"


def markdown_table(summary, names, baseline, value_key, ratio_key, unit_format):
    lines = ["| workload | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for workload, row in summary.items():
        cells = []
        for name in names:
            cell = row[name]
            if "failed" in cell:
                cells.append("failed")
            else:
                ratio = None if name == baseline else cell.get(ratio_key)
                cells.append(format_cell(cell[value_key], unit_format, ratio))
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(summary, names, baseline, meta, chart_name=None):
    lines = ["# Allocator comparison", ""]
    lines += [f"- {label}: {value}" for label, value in meta["description"]]
    lines += ["", f"Each cell is the median over the runs; in brackets, the ratio to {baseline} "
              f"(above 1.00: {baseline} took less time or memory).", "",
              "## Wall time (the workload's own timer)", ""]
    lines += markdown_table(summary, names, baseline, "median_seconds", "seconds_ratio",
                            lambda s: f"{s:.3f} s")
    lines += ["", "## CPU time (user + system of the whole process)", "",
              "Less disturbed than wall time by other load on the machine, but blind to time "
              "spent waiting, and counting spinning as work.", ""]
    lines += markdown_table(summary, names, baseline, "median_cpu_seconds", "cpu_ratio",
                            lambda s: f"{s:.3f} s")
    lines += ["", "## Peak RSS (VmHWM of the process)", ""]
    lines += markdown_table(summary, names, baseline, "median_peak_rss_kb", "rss_ratio",
                            lambda kb: f"{kb / 1024:.1f} MiB")
    soak = {w: row for w, row in summary.items()
            if any("median_peak_live_kb" in cell for cell in row.values())}
    for workload, row in soak.items():
        lines += ["", f"## {workload}: peak RSS / peak live bytes", "",
                  "| allocator | peak live | peak RSS | RSS / live |", "|---|---:|---:|---:|"]
        for name in names:
            cell = row[name]
            if "median_peak_live_kb" in cell:
                live, rss = cell["median_peak_live_kb"], cell["median_peak_rss_kb"]
                lines.append(f"| {name} | {live / 1024:.1f} MiB | {rss / 1024:.1f} MiB | "
                             f"{rss / live:.2f} |")
    for workload, row in summary.items():
        if not any("median_worst_phase" in cell for cell in row.values()):
            continue
        lines += ["", f"## {workload}: memory over time", "",
                  "RSS / live bytes over the second half of the phases (mean RSS over mean live), "
                  "its worst phase, and RSS before the first block against RSS after everything "
                  "was freed and the program sat idle.", "",
                  "| allocator | RSS / live, 2nd half | worst phase | RSS before | RSS after idle "
                  "| after − before |", "|---|---:|---:|---:|---:|---:|"]
        for name in names:
            cell = row[name]
            if "median_worst_phase" in cell:
                lines.append(f"| {name} | {cell['median_rss_live_2nd_half']:.2f} | "
                             f"{cell['median_worst_phase']:.2f} | "
                             f"{cell['median_rss_before_kb'] / 1024:.1f} MiB | "
                             f"{cell['median_rss_idle_kb'] / 1024:.1f} MiB | "
                             f"{cell['median_idle_delta_kb'] / 1024:+.1f} MiB |")
        if meta.get("timelines", {}).get(workload):
            lines += ["", f"![{workload}: memory over time]({meta['timelines'][workload]})"]
    spreads = [((c["max_seconds"] - c["min_seconds"]) / c["median_seconds"], w, n)
               for w, row in summary.items() for n, c in row.items() if "failed" not in c]
    if spreads:
        widest = max(spreads)
        lines += ["", f"Widest spread of a cell, (max − min) / median time: {widest[0]:.0%} "
                  f"({widest[1]} under {widest[2]})."]
    if meta["failures"]:
        lines += ["", "## Failed runs", ""] + [f"- {f}" for f in meta["failures"]]
    if chart_name:
        lines += ["", f"![time and peak RSS relative to {baseline}]({chart_name})"]
    return "\n".join(lines) + "\n"


def write_chart(summary, names, baseline, path):
    """Two panels of grouped bars, each allocator relative to the baseline on a log scale,
    drawn from 1 so that a bar points up where the baseline wins and down where it loses.
    Returns None, or why no chart was drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        return "python3-matplotlib is not installed"
    workloads = list(summary)
    others = [n for n in names if n != baseline]
    if not any("seconds_ratio" in summary[w][n] for w in workloads for n in others):
        return f"no allocator besides {baseline} has results to compare"
    figure, axes = plt.subplots(2, 1, figsize=(max(8, 1.4 * len(workloads)), 8), sharex=True)
    width = 0.8 / len(others)
    for axis, key, title in ((axes[0], "seconds_ratio", "wall time"),
                             (axes[1], "rss_ratio", "peak RSS")):
        for i, name in enumerate(others):
            xs, ys = [], []
            for x, workload in enumerate(workloads):
                ratio = summary[workload][name].get(key)
                if ratio:
                    xs.append(x - 0.4 + width * (i + 0.5))
                    ys.append(ratio)
            axis.bar(xs, [y - 1 for y in ys], width, bottom=1, label=name)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_yscale("log")
        ratios = [summary[w][n][key] for w in workloads for n in others if key in summary[w][n]]
        # At least 0.5× to 2×, so both directions always have a labelled tick.
        axis.set_ylim(min(0.5, min(ratios) / 1.15), max(2.0, max(ratios) * 1.15))
        axis.yaxis.set_major_locator(LogLocator(base=2))
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}×"))
        axis.yaxis.set_minor_formatter(NullFormatter())
        axis.set_ylabel(f"{title}: allocator / {baseline}")
        axis.set_title(f"{title} relative to {baseline} (bar up: {baseline} is better)")
        axis.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", ncol=len(others))
    axes[1].set_xticks(range(len(workloads)), workloads, rotation=20)
    figure.tight_layout(rect=(0, 0, 1, 0.95))
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return None
