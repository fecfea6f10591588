"""The evaluation report's PNG plots, written next to its JSON."""

from __future__ import annotations

from pathlib import Path

from flashdraft.files import atomic_path


def plot(report: dict, out_dir: Path, stem: str) -> list[Path]:
    """<stem>_acceptance_histogram.png and <stem>_slot_acceptance.png, one series per benchmark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = {
        name: r["speculative"] for name, r in report["benchmarks"].items() if r["speculative"]["verify_steps"]
    }
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(benches), 1)
    for i, (name, spec) in enumerate(benches.items()):
        lengths = [int(k) for k in spec["accept_length_histogram"]]
        counts = list(spec["accept_length_histogram"].values())
        total = sum(counts) or 1
        ax.bar([x + i * width for x in lengths], [c / total for c in counts], width=width,
               label=f"{name} (tau {spec['tau_pooled']:.2f})")
    ax.set_xticks(range(1, report["settings"]["block_size"] + 1))
    ax.set_xlabel("tokens per verify step (accepted drafts + bonus)")
    ax.set_ylabel("share of steps")
    ax.set_title("Acceptance length")
    ax.legend()
    fig.tight_layout()
    written.append(save_figure(fig, out_dir / f"{stem}_acceptance_histogram.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, spec in benches.items():
        rates = spec["slot_acceptance"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{name}: P(slots 1..k accepted)")
        cond = spec["slot_acceptance_conditional"]
        ax.plot(range(1, len(cond) + 1), cond, linestyle="--", label=f"{name}: P(slot k | 1..k-1)")
    ax.set_xticks(range(1, report["settings"]["block_size"]))
    ax.set_xlabel("draft slot k")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.02)
    ax.set_title("Per-slot acceptance")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(save_figure(fig, out_dir / f"{stem}_slot_acceptance.png"))
    return written


def save_figure(fig, path: Path) -> Path:
    """`fig` as a PNG at `path`, written atomically; the figure is closed."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return path
