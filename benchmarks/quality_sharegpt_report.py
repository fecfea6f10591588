"""Tables and the training-curve plot of the side-by-side quality run (`quality_sharegpt.sh collect`'s folder).

    python benchmarks/quality_sharegpt_report.py benchmarks/results/quality_sharegpt [--ours distill] [--against peer]

writes `quality.md` (per benchmark, both drafts: decoding tau, share of verify steps accepting at least k
drafted tokens, speedup, plain ms a token, lossless fraction; the difference of pooled tau paired by prompt,
with a bootstrap interval over the prompts; the teacher-forced expected tau beside it; where the speed
phase decoded both drafts at a serving dtype, their tau, speedup and step times there)
and `training_curves.png` (drafted-slot accuracy, train and held out: the one curve both objectives log
on the same scale, as their losses are normalised differently) into the same folder. `--ours NAME` sets
the draft set against the peer's (default flashdraft; an experiment's draft, e.g. distill, writes
`quality_NAME.md` and `training_curves_NAME.png`); `--against NAME` sets the draft it is compared with
(default peer; e.g. flashdraft, for a variant of our own recipe: `quality_OURS_vs_NAME.md`). The drafts must
have trained on the same answers, unless `--other-answers` says the training data is what is compared.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from flashdraft.config import flatten
from flashdraft.decoding.plots import save_figure
from flashdraft.files import write_text
from flashdraft.train.trainer import OTHER_STAGES, RESUMABLE_CHANGES

OURS, PEER = "flashdraft", "peer"
VARIANT_FOLDER = re.compile(r"variant_[A-Za-z0-9._-]+/")  # a variant's WORK links the run's answers
MIN_ACCEPTED = (1, 2, 3, 4)
BOOTSTRAP_DRAWS = 4000
# The speed phase's report tags (quality_sharegpt.sh): SPEED_DTYPE, then _blockN where SPEED_BLOCK set the verify's.
SPEED_TAG = re.compile(r"(bfloat16|float16)(?:_block([1-9][0-9]*))?")


def run_settings(config: dict) -> dict[str, str]:
    """A training config's flat settings that shape the run (the trainer's own list of those that do not:
    folders, cadences, other stages), with a variant's folder dropped from its paths."""
    return {key: VARIANT_FOLDER.sub("", repr(value)) for key, value in flatten(config).items()
            if key not in RESUMABLE_CHANGES and key.split(".")[0] not in OTHER_STAGES}


def differing_keys(settings: list[dict[str, str]]) -> list[str]:
    """The keys whose values are not the same in all of `settings` (`run_settings` dicts)."""
    return sorted(key for key in set().union(*settings) if len({s.get(key) for s in settings}) > 1)


def accepting_at_least(histogram: dict[str, int], k: int) -> float:
    """Share of verify steps that accepted at least k drafted tokens (a step emitting k+1 tokens)."""
    steps = sum(histogram.values())
    return sum(n for length, n in histogram.items() if int(length) >= k + 1) / steps


def draft_numbers(result: dict) -> dict:
    """One draft's numbers on one benchmark of an evaluate report."""
    spec = result["speculative"]
    return {"tau_pooled": spec["tau_pooled"], "tau_per_request": spec["tau_mean_of_requests"],
            "accepting": [accepting_at_least(spec["accept_length_histogram"], k) for k in MIN_ACCEPTED],
            "speedup": result["speedup"], "plain_ms": result["autoregressive"]["ms_per_step"],
            "spec_ms": spec["ms_per_step"], "lossless": result["lossless"], "prompts": result["num_prompts"]}


def benchmark_rows(folder: Path, ours: str = OURS, against: str = PEER) -> list[dict]:
    """Per benchmark, both drafts' numbers (keyed by draft name) and the paired difference, `ours` minus
    `against`'s."""
    reports = {name: json.loads((folder / f"{name}_report.json").read_text()) for name in (ours, against)}
    rows = []
    for bench in reports[ours]["benchmarks"]:
        row = {"benchmark": bench, **{name: draft_numbers(report["benchmarks"][bench])
                                      for name, report in reports.items()}}
        row["paired"] = paired_difference(reports[ours]["benchmarks"][bench]["per_prompt"],
                                          reports[against]["benchmarks"][bench]["per_prompt"])
        rows.append(row)
    return rows


def cards_line(folder: Path, ours: str, against: str, report: str) -> str:
    """A line where the two drafts' NAME_REPORT.json decoded on other cards (nothing where on one kind): then
    each speedup is against plain decoding on its own card, and the milliseconds do not compare."""
    cards = {name: json.loads((folder / f"{name}_{report}.json").read_text())["settings"]["device_name"]
             for name in (ours, against)}
    if cards[ours] == cards[against]:
        return ""
    return (f"{ours} decoded on {cards[ours]}, {against} on {cards[against]}: each speedup is against plain "
            "decoding on its own card, and the milliseconds do not compare.")


def speed_tags(folder: Path, names: tuple[str, ...]) -> list[re.Match]:
    """The speed phase's report tags (DTYPE or DTYPE_blockN, parsed by SPEED_TAG) that any of `names` has in
    `folder`, each dtype's full-block pass before its shorter verifies."""
    tags = {match.group(0): match for name in names for path in folder.glob(f"{name}_report_*.json")
            if (match := SPEED_TAG.fullmatch(path.name.removeprefix(f"{name}_report_").removesuffix(".json")))}
    return sorted(tags.values(), key=lambda m: (m.group(1), -int(m.group(2)) if m.group(2) else -(10**9)))


def speed_section(folder: Path, ours: str = OURS, against: str = PEER) -> str:
    """The speed phase's decoding at a serving dtype (NAME_report_DTYPE[_blockN].json), both drafts per
    benchmark; a line saying which draft lacks it where only one has it, nothing where neither does. No paired
    tau: at that dtype the two drafts' outputs may part from plain decoding, and then from each other."""
    lines = []
    for match in speed_tags(folder, (ours, against)):
        tag, (dtype, block) = match.group(0), match.groups()
        label = dtype + (f", verifying {block} tokens a step" if block else "")
        paths = {name: folder / f"{name}_report_{tag}.json" for name in (ours, against)}
        have = [name for name, path in paths.items() if path.is_file()]
        if len(have) == 1:
            lines += ["", f"Speed at {label}: only {have[0]} was decoded at it (the speed phase, SPEED_DTYPE"
                      + (", SPEED_BLOCK)." if block else ").")]
            continue
        reports = {name: json.loads(path.read_text()) for name, path in paths.items()}
        settings = reports[ours]["settings"]
        lines += ["", f"Speed at {label}, the dtype a server runs ({settings['device_name']}, the same prompts). "
                  "Its sequences equal to plain decoding count rounding too (the two steps' kernels round "
                  "differently): losslessness is the float32 table's.",
                  *filter(None, [cards_line(folder, ours, against, f"report_{tag}")]), "",
                  f"| benchmark | tau pooled ({ours} / {against}) | speedup | plain ms a token "
                  "| draft+verify ms a step | sequences equal to plain |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for bench in reports[ours]["benchmarks"]:
            f, p = (draft_numbers(reports[name]["benchmarks"][bench]) for name in (ours, against))
            lines.append(f"| {bench} | {f['tau_pooled']:.2f} / {p['tau_pooled']:.2f} "
                         f"| {f['speedup']:.2f}x / {p['speedup']:.2f}x | {f['plain_ms']:.2f} / {p['plain_ms']:.2f} "
                         f"| {f['spec_ms']:.2f} / {p['spec_ms']:.2f} | {f['lossless']:.2f} / {p['lossless']:.2f} |")
    return "\n".join(lines) + "\n" if lines else ""


def pooled_tau(prompts: list[dict], picks: list[int]) -> float:
    return sum(prompts[i]["new_tokens"] for i in picks) / sum(prompts[i]["verify_steps"] for i in picks)


def paired_difference(ours: list[dict], peer: list[dict], seed: int = 0) -> dict:
    """Pooled tau, ours minus the peer's, over the same prompts, and its 95% bootstrap interval.

    Both drafts decode the same prompts (greedy, lossless: the same tokens), so resampling prompts with
    replacement, the same picks for both, measures how much of a difference the prompt sample alone
    explains. It says nothing of the training seed's spread, which needs more trainings."""
    if len(ours) != len(peer) or any(a["new_tokens"] != b["new_tokens"] for a, b in zip(ours, peer)):
        raise SystemExit("error: the two reports did not decode the same prompts to the same lengths; "
                         "evaluate both drafts with the same benchmarks and settings")
    everything = list(range(len(ours)))
    rng = random.Random(seed)
    draws = sorted(pooled_tau(ours, picks) - pooled_tau(peer, picks)
                   for picks in ([rng.randrange(len(ours)) for _ in everything] for _ in range(BOOTSTRAP_DRAWS)))
    return {"difference": pooled_tau(ours, everything) - pooled_tau(peer, everything),
            "low": draws[int(0.025 * BOOTSTRAP_DRAWS)], "high": draws[int(0.975 * BOOTSTRAP_DRAWS) - 1],
            "ahead": sum(a["tau"] > b["tau"] for a, b in zip(ours, peer)),
            "behind": sum(a["tau"] < b["tau"] for a, b in zip(ours, peer))}


def answers_record(folder: Path, name: str) -> dict[str, str] | None:
    """The sha256 of the answers a draft trained on, as `collect` records them (a variant's record is
    NAME_evidence.json, the run's own evidence.json); None where they were collected before it kept them."""
    path = folder / f"{name}_evidence.json"
    path = path if path.is_file() else folder / "evidence.json"
    return json.loads(path.read_text()).get("answers sha256") if path.is_file() else None


def answers_checked(records: dict[str, dict[str, str] | None], other_answers: bool = False) -> str:
    """A line on whether the drafts (label -> `answers_record`) trained on the same answers. Other answers
    end the comparison (a difference would mix the recipe's effect with the data's) unless `other_answers`
    says the data is what is compared; then the same answers end it, as the comparison would not be one."""
    recorded = {label: record for label, record in records.items() if record is not None}
    missing = [label for label, record in records.items() if record is None]
    labels = list(recorded)
    parts = []
    for label in labels[1:]:
        first, other = recorded[labels[0]], recorded[label]
        either = first.keys() | other.keys()
        files = sorted(f for f in either if first.get(f) != other.get(f))
        if files and not other_answers:
            raise SystemExit(f"error: {labels[0]} and {label} trained on other answers ({', '.join(files)} differ); "
                             "train them on one warmup's answers (the variants phase on that run's WORK), or pass "
                             "--other-answers where the training data is what you compare")
        if not files and other_answers:
            raise SystemExit(f"error: --other-answers, but {labels[0]} and {label} trained on the same answers; "
                             "drop --other-answers")
        if files:
            parts.append(f"other for {labels[0]} than for {label} on purpose, a comparison of training data "
                         f"({len(files)} of {len(either)} files differ, sha256 checked)")
    if len(recorded) > 1 and not parts:
        drafts = "both" if len(recorded) == 2 else f"all {len(recorded)}"
        files = len(recorded[labels[0]])
        parts.append(f"the same for {drafts} ({files} file{'' if files == 1 else 's'}, sha256 checked)")
    if missing:
        names = " and ".join(missing) if len(missing) <= 2 else ", ".join(missing)
        parts.append(f"not recorded for {names} (collected before answer hashes were kept)")
    return f"Training answers: {'; '.join(parts)}."


def heldout_tau(folder: Path, ours: str = OURS, against: str = PEER) -> dict[str, dict]:
    out = {}
    for name in (ours, against):
        (result,) = json.loads((folder / f"{name}_heldout_tau.json").read_text())["results"].values()
        out[name] = result
    return out


def markdown(rows: list[dict], teacher: dict[str, dict], settings: dict, note: str = "", ours: str = OURS,
             against: str = PEER) -> str:
    lines = [
        f"Evaluation: {settings['device_name']}, {settings['dtype']}, greedy, {settings['max_new_tokens']} new "
        f"tokens, block {settings['block_size']}, compiled layers {settings['compiled']}, torch "
        f"{settings['versions']['torch']}, transformers {settings['versions']['transformers']}.",
        *([note] if note else []),
        "",
        f"| benchmark | prompts | tau pooled ({ours} / {against}) | tau per request | speedup | plain ms a token "
        "| draft+verify ms a step | lossless |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        f, p = row[ours], row[against]
        lines.append(
            f"| {row['benchmark']} | {f['prompts']} | {f['tau_pooled']:.2f} / {p['tau_pooled']:.2f} "
            f"| {f['tau_per_request']:.2f} / {p['tau_per_request']:.2f} | {f['speedup']:.2f}x / {p['speedup']:.2f}x "
            f"| {f['plain_ms']:.2f} / {p['plain_ms']:.2f} | {f['spec_ms']:.2f} / {p['spec_ms']:.2f} "
            f"| {f['lossless']:.2f} / {p['lossless']:.2f} |")
    lines += ["", f"Share of verify steps accepting at least k drafted tokens ({ours} / {against}):", "",
              "| benchmark | " + " | ".join(f"k = {k}" for k in MIN_ACCEPTED) + " |",
              "| --- |" + " ---: |" * len(MIN_ACCEPTED)]
    for row in rows:
        cells = [f"{a:.2f} / {b:.2f}" for a, b in zip(row[ours]["accepting"], row[against]["accepting"])]
        lines.append(f"| {row['benchmark']} | " + " | ".join(cells) + " |")
    lines += ["", f"Pooled tau, {ours} minus {against}, paired by prompt (95% bootstrap interval over the prompts, "
              f"{BOOTSTRAP_DRAWS} draws; prompts where a draft's own tau is higher):", "",
              f"| benchmark | difference | 95% interval | {ours} ahead / behind |", "| --- | ---: | ---: | ---: |"]
    for row in rows:
        d = row["paired"]
        lines.append(f"| {row['benchmark']} | {d['difference']:+.3f} | [{d['low']:+.3f}, {d['high']:+.3f}] "
                     f"| {d['ahead']} / {d['behind']} |")
    lines += ["", "Teacher-forced on the target's own answers to the held-out ShareGPT conversations "
              "(the training evaluation's expected tau, 64 random anchors a sample):", "",
              "| | expected tau | slot-1 accuracy | drafted-slot accuracy | samples |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for name in (ours, against):
        t = teacher[name]
        lines.append(f"| {name} | {t['eval_tau']:.2f} | {t['eval_acc_slot_1']:.3f} | {t['eval_accuracy']:.3f} "
                     f"| {t['samples']} |")
    return "\n".join(lines) + "\n"


def curves_title(ours: str, against: str, same_data: bool, last_steps: dict[str, int]) -> str:
    """The curves' heading: what the two runs share, and their step counts where those differ."""
    data = "same data" if same_data else "other training data"
    if last_steps[ours] == last_steps[against]:
        shared = "same data and steps" if same_data else data
    else:
        shared = f"{data}, {last_steps[ours]} vs {last_steps[against]} steps"
    return f"SmolLM2-135M drafts, {shared}: {ours} vs {against}"


def plot_curves(folder: Path, path: Path, ours: str = OURS, against: str = PEER, same_data: bool = True) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    last_steps = {}
    for name, color in zip((ours, against), ("tab:blue", "tab:orange")):
        rows = [json.loads(line) for line in (folder / f"{name}_training_curve.jsonl").read_text().splitlines()]
        train = [r for r in rows if "accuracy" in r]
        last_steps[name] = train[-1]["step"]
        held = [r for r in rows if "eval_accuracy" in r]
        ax.plot([r["step"] for r in train], [r["accuracy"] for r in train], color=color, label=f"{name} train")
        ax.plot([r["step"] for r in held], [r["eval_accuracy"] for r in held], "o--", color=color,
                label=f"{name} held out")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("drafted-slot accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle(curves_title(ours, against, same_data, last_steps))
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the evidence folder of quality_sharegpt.sh collect")
    parser.add_argument("--note", default="", help="a line under the heading: how this run differed from the script")
    parser.add_argument("--ours", default=OURS, help="the draft set against the other (default flashdraft)")
    parser.add_argument("--against", default=PEER, help="the draft it is compared with (default peer)")
    parser.add_argument("--other-answers", action="store_true",
                        help="the drafts trained on other answers on purpose: the comparison is of training data")
    args = parser.parse_args(argv)
    if args.ours == args.against:
        raise SystemExit(f"error: --ours and --against both name {args.ours}; a draft is compared with another draft")
    needed = [f"{name}_{part}" for name in (args.ours, args.against)
              for part in ("report.json", "heldout_tau.json", "training_curve.jsonl")]
    missing = [name for name in needed if not (args.folder / name).is_file()]
    if missing:
        raise SystemExit(f"error: {args.folder} lacks {', '.join(missing)}; give the folder that "
                         "`quality_sharegpt.sh collect WORK OUT` wrote")
    settings = json.loads((args.folder / f"{args.ours}_report.json").read_text())["settings"]
    records = {name: answers_record(args.folder, name) for name in (args.ours, args.against)}
    note = " ".join(filter(None, [args.note, answers_checked(records, args.other_answers),
                                  cards_line(args.folder, args.ours, args.against, "report")]))
    text = markdown(benchmark_rows(args.folder, args.ours, args.against),
                    heldout_tau(args.folder, args.ours, args.against), settings, note, args.ours, args.against)
    text += speed_section(args.folder, args.ours, args.against)
    suffix = ("" if (args.ours, args.against) == (OURS, PEER)
              else f"_{args.ours}" if args.against == PEER else f"_{args.ours}_vs_{args.against}")
    write_text(args.folder / f"quality{suffix}.md", text)
    plot_curves(args.folder, args.folder / f"training_curves{suffix}.png", args.ours, args.against,
                same_data=not args.other_answers)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
