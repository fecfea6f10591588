"""The step breakdown benchmark (CPU, tiny target): it decodes on evaluate's harness, times every part, and
refuses bad input before loading anything."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from flashdraft.cli import main as cli
from flashdraft.config import load_config
from tiny_models import save_tiny_target

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import spec_step_breakdown as script  # noqa: E402


def draft_for(target: Path, out: Path) -> Path:
    assert cli(["draft-init", "--target", str(target), "--output", str(out), "--num-layers", "1",
                "--num-taps", "2", "--block-size", "4", "--seed", "1"]) == 0
    return out


def test_breakdown_decodes_on_the_harness_and_times_every_part(tiny_target, tmp_path):
    torch.set_num_threads(1)
    target = tiny_target("qwen3")
    out = tmp_path / "breakdown.json"
    assert script.main(["--target", str(target), "--draft", str(draft_for(target, tmp_path / "draft")),
                        "--device", "cpu", "--prompt-len", "16", "--new-tokens", "12", "--repeats", "2",
                        "--profile", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    whole = report["whole_steps"]
    # float32 on the CPU: the speculative loop must give the plain loop's tokens, through the same harness.
    assert whole["equal_outputs"] is True
    assert whole["plain_steps"] == 11 and 1 <= whole["speculative_steps"] <= 11
    assert whole["tau"] == pytest.approx(11 / whole["speculative_steps"])
    assert set(report["parts"]) == {"draft forward (graph)", "drafts' argmax, block ids", "verify forward (graph)",
                                    "acceptance, host sync", "plain forward (graph)", "plain argmax, host sync"}
    for times in report["parts"].values():
        assert times["back_to_back_ms"] > 0 and times["alone_ms"] > 0 and 0 < times["issue_ms"]
    # Profiled: the three captured forwards, each with its table of ops (on the CPU, no device events).
    assert set(report["profiles"]) == {"draft forward (graph)", "verify forward (graph)", "plain forward (graph)"}
    for profile in report["profiles"].values():
        assert profile["calls"] == 2 and profile["device_events_per_call"] == 0 and "aten::" in profile["top"]
    spec = report["speculative_step"]
    assert spec["in_parts_ms"] + spec["remainder_ms"] == pytest.approx(whole["speculative_ms_per_step"])
    assert report["harness"]["compiled"] is False and report["block_size"] == 4 and report["dtype"] == "float32"


def test_a_draft_of_another_target_is_refused_before_loading(tiny_target, tmp_path, capsys):
    other = save_tiny_target(tmp_path / "wider", "qwen3", hidden=96)
    out = tmp_path / "breakdown.json"
    assert script.main(["--target", str(tiny_target("qwen3")), "--draft", str(draft_for(other, tmp_path / "draft")),
                        "--device", "cpu", "--out", str(out)]) == 2
    assert "draft hidden size 96 != target hidden size 64" in capsys.readouterr().err
    assert not out.exists()


def test_a_repeat_count_below_one_is_refused(tiny_target, tmp_path, capsys):
    out = tmp_path / "breakdown.json"
    assert script.main(["--target", str(tiny_target("qwen3")), "--draft", str(tmp_path / "nowhere"),
                        "--repeats", "0", "--out", str(out)]) == 2
    assert "--repeats is 0; give at least 1" in capsys.readouterr().err
    assert not out.exists()


def test_random_weights_of_smollm2s_shape_load_as_a_target_and_draft(tmp_path):
    """`--random smollm2` (the GPU run's mode) writes a target and a draft that pass evaluate's checks and
    decode on its harness: SmolLM2's 30 layers and the smollm2_135m recipe's 16-token draft."""
    torch.set_num_threads(2)
    out = tmp_path / "breakdown.json"
    assert script.main(["--random", "smollm2", "--device", "cpu", "--prompt-len", "4", "--new-tokens", "16",
                        "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    recipe_layers = load_config("smollm2_135m").draft.num_layers
    assert (report["target_layers"], report["draft_layers"], report["block_size"]) == (30, recipe_layers, 16)
    assert report["random_weights"] == "smollm2" and report["whole_steps"]["plain_steps"] == 15


def test_fewer_new_tokens_than_a_block_is_refused(tiny_target, tmp_path, capsys):
    target = tiny_target("qwen3")
    out = tmp_path / "breakdown.json"
    assert script.main(["--target", str(target), "--draft", str(draft_for(target, tmp_path / "draft")),
                        "--device", "cpu", "--new-tokens", "3", "--out", str(out)]) == 2
    assert "--new-tokens is 3, shorter than the draft's block of 4" in capsys.readouterr().err
    assert not out.exists()


def test_a_shorter_verify_block_is_timed_and_one_past_the_drafts_is_refused(tiny_target, tmp_path, capsys):
    torch.set_num_threads(1)
    target = tiny_target("qwen3")
    draft = draft_for(target, tmp_path / "draft")
    out = tmp_path / "breakdown.json"
    common = ["--target", str(target), "--draft", str(draft), "--device", "cpu", "--prompt-len", "8",
              "--new-tokens", "8", "--repeats", "1", "--out", str(out)]
    assert script.main([*common, "--block", "2"]) == 0
    report = json.loads(out.read_text())
    assert (report["block_size"], report["draft_block_size"]) == (2, 4)
    # Verifying one draft a step, the speculative loop still decodes the plain loop's tokens.
    assert report["whole_steps"]["equal_outputs"] is True and report["whole_steps"]["tau"] <= 2
    out.unlink()
    assert script.main([*common, "--block", "5"]) == 2
    assert "--block 5 is outside 2..4" in capsys.readouterr().err
    assert not out.exists()


def test_graph_structure_tells_a_chain_from_other_shapes():
    """What the GPU run reports of each captured step: a chain of kernels launches in constant time, a fork
    (here a memset beside a kernel, joined after) does not."""
    chain = script.structure([0, 0, 0], [(0, 1), (1, 2)])
    assert chain["straight_line"] is True and chain["node_types"] == {"kernel": 3} and chain["roots"] == 1
    fork = script.structure([0, 2, 0, 0], [(0, 1), (0, 2), (1, 3), (2, 3)])
    assert fork["straight_line"] is False and fork["node_types"] == {"kernel": 3, "memset": 1}
    assert (fork["most_dependencies"], fork["most_dependents"]) == (2, 2)
    assert script.structure([0, 4], [])["straight_line"] is False  # two roots: not one chain


class FakeDriver:
    """libcuda's graph queries over a known graph: node handles 0x10, 0x20, ... with CUgraphNodeType codes,
    edges as handle pairs; `versioned` picks cuGraphGetEdges_v2 (with edge data) or the older call."""

    def __init__(self, types: list[int], edges: list[tuple[int, int]], versioned: bool):
        self.handles = [0x10 * (i + 1) for i in range(len(types))]
        self.types = dict(zip(self.handles, types))
        self.edges = [(self.handles[a], self.handles[b]) for a, b in edges]
        if versioned:
            self.cuGraphGetEdges_v2 = lambda graph, sources, targets, data, count: self._edges(sources, targets, count)
        else:
            self.cuGraphGetEdges = lambda graph, sources, targets, count: self._edges(sources, targets, count)

    @staticmethod
    def _fill(array, values, count) -> int:
        if array is not None:
            for i, value in enumerate(values):
                array[i] = value
        count._obj.value = len(values)
        return 0

    def cuGraphGetNodes(self, graph, nodes, count) -> int:
        assert graph.value == 0xABC
        return self._fill(nodes, self.handles, count)

    def cuGraphNodeGetType(self, node, kind) -> int:
        kind._obj.value = self.types[node.value]
        return 0

    def _edges(self, sources, targets, count) -> int:
        self._fill(sources, [a for a, _ in self.edges], count)
        return self._fill(targets, [b for _, b in self.edges], count)


@pytest.mark.parametrize("versioned", [True, False])
def test_the_driver_graph_reader_returns_each_nodes_type_and_the_edges(versioned):
    edges = [(0, 1), (0, 2), (1, 3), (2, 3)]
    assert script.driver_graph(0xABC, FakeDriver([0, 2, 0, 1], edges, versioned)) == ([0, 2, 0, 1], edges)
