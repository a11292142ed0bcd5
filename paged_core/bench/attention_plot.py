"""The figure of ``bench attention``: one decode and one prefill panel per dtype.

Decode panels: GB/s of K+V read against context length at the grid's largest batch, each
sequence's blocks scattered, one colour per CPU path level (one line style per model shape),
the best path's rate over consecutive blocks (thin, same style) and the measured memory
bandwidth as a horizontal line. Prefill panels: attention GFLOP/s against prompt length for one
prompt per step, per level (solid) with the rate of that level's linears (dotted, same
colour), and torch SDPA (black).
"""
from __future__ import annotations

from typing import Any

from .report import new_figure, save_plot

STYLES = ("o-", "s--", "^-.")
COLORS = {"generic": "tab:gray", "avx2": "tab:blue", "avx512": "tab:orange",
          "avx512_bf16": "tab:green", "avx512_bf16+amx": "tab:red"}


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    dtypes = results["dtypes"]
    fig, axes = new_figure(ncols=2 * len(dtypes), width=4.6, height=4.4)
    for i, dtype in enumerate(dtypes):
        _decode_panel(axes[0][i], results, dtype)
        _prefill_panel(axes[0][len(dtypes) + i], results, dtype)
    fig.suptitle(f"CPU attention per CPU path on {results['machine_summary']} (load average "
                 f"{results['load_average_before']:.1f} -> {results['load_average_after']:.1f})"
                 f"\n{results['run_command']}", fontsize=9)
    save_plot(fig, out_dir, name)


def _decode_panel(ax, results: dict[str, Any], dtype: str) -> None:
    s = results["settings"]
    batch = max(s["batches"])
    for style, shape in zip(STYLES, s["decode_shapes"]):
        def rows_of(level: str, blocks: str) -> list[dict[str, Any]]:
            return [r for r in results["decode"] if r["dtype"] == dtype and r["shape"] == shape
                    and r["batch"] == batch and r["path"] == level
                    and r.get("blocks", "scattered") == blocks]

        for level in results.get("paths", results["levels"]):
            rows = rows_of(level, "scattered")
            if not rows:  # the AMX path times bfloat16 only
                continue
            ax.plot([r["context"] for r in rows], [r["gbs"] for r in rows], style,
                    color=COLORS.get(level), label=f"{level}, {shape}")
        consecutive = {level: rows_of(level, "consecutive")
                       for level in results.get("paths", results["levels"])}
        best = max((level for level in consecutive if consecutive[level]), default=None,
                   key=lambda level: max(r["gbs"] for r in consecutive[level]))
        if best is not None:
            rows = consecutive[best]
            ax.plot([r["context"] for r in rows], [r["gbs"] for r in rows], style,
                    color=COLORS.get(best), linewidth=0.8, alpha=0.6,
                    label=f"{best}, {shape}, consecutive blocks")
    ax.axhline(results["bandwidth"]["read_gbs"], color="black", linestyle=":",
               label="measured bandwidth (sum)")
    _log_x(ax, s["contexts"], "context tokens")
    ax.set(ylabel="GB/s of K+V read (median)", title=f"decode, {dtype}, {batch} seqs",
           ylim=(0, None))
    ax.legend(fontsize=6)


def _prefill_panel(ax, results: dict[str, Any], dtype: str) -> None:
    s = results["settings"]
    batch = min(s["prefill_batches"])
    rows = [r for r in results["prefill"] if r["dtype"] == dtype and r["batch"] == batch]
    for level in [*results.get("paths", results["levels"]), "torch_sdpa"]:
        mine = [r for r in rows if r["path"] == level]
        if not mine:
            continue
        prompts = [r["prompt"] for r in mine]
        color = COLORS.get(level, "black")
        ax.plot(prompts, [r["gflops"] for r in mine], "o-", color=color, label=level)
        if mine and "linear" in mine[0]:
            ax.plot(prompts, [r["linear_gflops"] for r in mine], ":", color=color,
                    label=f"{level} linears ({mine[0]['linear']})")
    _log_x(ax, s["prompts"], "prompt tokens")
    ax.set(ylabel="GFLOP/s (median)", title=f"prefill, {dtype}, {batch} prompt(s) per step",
           ylim=(0, None))
    ax.legend(fontsize=6)


def _log_x(ax, ticks: list[int], label: str) -> None:
    """A log x axis labelled at the grid's own values only."""
    ax.set_xscale("log")
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(label)
