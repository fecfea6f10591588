"""Where a speculative decoding step's time goes: the draft's forward, the verify's, and the rest.

`flashdraft evaluate` times whole steps, a draft + verify step against a plain one; on a small target the
first costs several plain steps (RESULTS.md section 8: 3.3 against 1.4 ms on SmolLM2, bf16, one H100), so
a draft pays only above that tau. This takes both steps apart on evaluate's own harness
(`flashdraft.decoding.harness`: the target and the draft loaded as evaluate loads them, its compiled
layers, fused projections, attention and CUDA graphs), on one prompt of random tokens:

- the whole steps, from one sequence decoded by each loop (ms a step, prefill excluded; no stop token);
- each part of a step on its own, `--repeats` times: the captured draft forward, block verify and
  one-token forward, and the host-side glue between them (the drafts' argmax and the block's ids; the
  acceptance and the step's one host sync). Two times each: back to back with one sync at the end (the
  device's time, or the host's where issuing is slower) and alone, synced after every call (what the
  part costs where the loop waits for it);
- the remainder, the whole speculative step minus its parts back to back: time in no part, the host's
  between the step's sync and the next step's launches;
- with `--profile CALLS`, the three captured forwards under torch.profiler: device events (kernels, copies)
  a call and the top kernels by device time;
- on a GPU, each step's graph shape (nodes by kind, edges, whether one chain): captured once more into a
  graph that keeps its node list, read with the CUDA driver API. A chain launches in constant time. (The
  first run found the verify's launch holding the host about as long as the GPU ran it, in a chain: the
  cause was sdpa's cuDNN kernel for the masked 16-token verify, RESULTS.md section 8.)

The tau does not matter here: a step's time does not depend on how much of the block is accepted. It
does depend on the block, which `--block` sets below the draft's (evaluate's `--block-size`): a draft that
seldom has more than a few drafts accepted loses little tau to a shorter verify.

    python benchmarks/spec_step_breakdown.py --target SmolLM2-135M-Instruct.Q4_1.gguf --draft DRAFT \\
        --prompt-len 1500 --out breakdown.json
    # the same shapes with random weights (no GGUF to carry), written to a temporary folder and loaded alike
    python benchmarks/spec_step_breakdown.py --random smollm2 --prompt-len 1500 --out breakdown.json
    # CPU smoke run (tests): a tiny target and draft, float32
    python benchmarks/spec_step_breakdown.py --target TINY --draft TINY_DRAFT --device cpu --prompt-len 16 \\
        --new-tokens 12 --repeats 3 --out /tmp/breakdown.json
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's flashdraft

from flashdraft.config import TargetConfig, load_config  # noqa: E402
from flashdraft.data.sampling import Sampling, choose  # noqa: E402
from flashdraft.decoding.decoding import block_ids, generate, step_outcome  # noqa: E402
from flashdraft.decoding.evaluate import DTYPES, ieee_float32_dots, resolve_device, resolve_dtype  # noqa: E402
from flashdraft.decoding.harness import DecodingHarness, check_pair  # noqa: E402
from flashdraft.decoding.sampling import accept_greedy  # noqa: E402
from flashdraft.errors import UserError  # noqa: E402
from flashdraft.files import check_output_file, write_json  # noqa: E402
from flashdraft.model.build import build_draft_config, new_draft  # noqa: E402
from spec_decode import SHAPES as DECODE_SHAPES  # noqa: E402  (this script's folder is on sys.path)

GREEDY = Sampling()
# SmolLM2-135M-Instruct's sizes (spec_decode.py keeps them), drafted by the recipe of that name: unlike
# spec_decode.py's fixed draft, this one follows the recipe.
SHAPES = {"smollm2": (DECODE_SHAPES["smollm2"]["target"], "smollm2_135m")}


def write_random_pair(shape: str, folder: Path) -> tuple[Path, Path]:
    """A random Llama target of `shape` and a random draft for it as its recipe builds one (the MASK id the
    last row: no tokenizer here), as HF folders: a step's time does not depend on the weights."""
    sizes, recipe = SHAPES[shape]
    torch.manual_seed(0)
    target = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**sizes), dtype=torch.bfloat16)
    target.save_pretrained(folder / "target")
    section = dataclasses.replace(load_config(recipe).draft, mask_token_id=sizes["vocab_size"] - 1)
    draft = new_draft(build_draft_config(section, target.config, tokenizer=None), seed=0)
    draft.to(torch.bfloat16).save_pretrained(folder / "draft", safe_serialization=True)
    return folder / "target", folder / "draft"


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timed(fn: Callable[[], object], repeats: int, device: torch.device) -> dict:
    """ms a call back to back (one sync at the end), ms to issue one, and ms a call synced after each."""
    fn()
    start = _sync(device)
    for _ in range(repeats):
        fn()
    issued = time.perf_counter()
    end = _sync(device)
    alone = 0.0
    for _ in range(repeats):
        began = _sync(device)
        fn()
        alone += _sync(device) - began
    return {"back_to_back_ms": 1000 * (end - start) / repeats, "issue_ms": 1000 * (issued - start) / repeats,
            "alone_ms": 1000 * alone / repeats}


def profiled(fn: Callable[[], object], calls: int, device: torch.device, rows: int) -> dict:
    """torch.profiler over `calls` calls: device events (kernels and copies, those inside replayed CUDA
    graphs too) a call, and the top rows by device time (CPU time off the GPU)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    fn()
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        for _ in range(calls):
            fn()
        _sync(device)
    device_events = sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA)
    return {"calls": calls, "device_events_per_call": device_events / calls,
            "top": prof.key_averages().table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                                             row_limit=rows)}


# CUgraphNodeType, in the CUDA driver API's order.
NODE_TYPES = ("kernel", "memcpy", "memset", "host", "child graph", "empty", "event wait", "event record",
              "semaphore signal", "semaphore wait", "memory alloc", "memory free", "batch memory op", "conditional")


def structure(types: Sequence[int], edges: Sequence[tuple[int, int]]) -> dict:
    """Node count, kinds and shape of a graph given each node's CUgraphNodeType and its edges (node indices).
    `straight_line`: one chain, each node depending on the one before, the shape CUDA launches in constant
    time since 12.x (NVIDIA: "constant time launch for straight-line CUDA graphs"); a launch of another shape
    may cost host time per node."""
    into, out = Counter(b for _, b in edges), Counter(a for a, _ in edges)
    straight = len(types) <= 1 or (len(edges) == len(types) - 1 and max(into.values()) == 1 == max(out.values()))
    return {"nodes": len(types), "edges": len(edges), "roots": len(types) - len(into),
            "most_dependencies": max(into.values(), default=0), "most_dependents": max(out.values(), default=0),
            "straight_line": straight,
            "node_types": dict(Counter(NODE_TYPES[t] if t < len(NODE_TYPES) else f"type {t}" for t in types))}


def driver_graph(handle: int, driver=None) -> tuple[list[int], list[tuple[int, int]]]:
    """Each node's type and the edges of the CUDA graph `handle` (a cudaGraph_t), read with the driver API
    (`driver`: libcuda, or a stand-in in the tests)."""
    driver = driver or ctypes.CDLL("libcuda.so.1")

    def check(result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"{call} returned CUresult {result}")

    graph, count = ctypes.c_void_p(handle), ctypes.c_size_t(0)
    check(driver.cuGraphGetNodes(graph, None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    check(driver.cuGraphGetNodes(graph, nodes, ctypes.byref(count)), "cuGraphGetNodes")
    index = {node: i for i, node in enumerate(nodes)}
    types = []
    for node in nodes:
        kind = ctypes.c_int(0)
        check(driver.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType")
        types.append(kind.value)
    # CUDA 12.3+ has the _v2 call (edge data too: 8 bytes an edge); the older one takes no edge data.
    versioned = hasattr(driver, "cuGraphGetEdges_v2")
    get_edges = driver.cuGraphGetEdges_v2 if versioned else driver.cuGraphGetEdges
    extra = (None,) if versioned else ()
    edges = ctypes.c_size_t(0)
    check(get_edges(graph, None, None, *extra, ctypes.byref(edges)), "cuGraphGetEdges")
    sources, targets = (ctypes.c_void_p * edges.value)(), (ctypes.c_void_p * edges.value)()
    data = ((ctypes.c_uint8 * (8 * edges.value))(),) if versioned else ()
    check(get_edges(graph, sources, targets, *data, ctypes.byref(edges)), "cuGraphGetEdges")
    return types, [(index[a], index[b]) for a, b in zip(sources, targets)]


def captured_structure(fn: Callable[[], object]) -> dict:
    """Capture `fn` (a step function, warm) once more into a graph that keeps its node list, and read its
    structure: the graphs the loops replay are instantiated and their node lists dropped."""
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            fn()
        return structure(*driver_graph(graph.raw_cuda_graph()))
    except (RuntimeError, TypeError, OSError, AttributeError) as err:  # an older torch or driver: say so
        return {"error": f"{type(err).__name__}: {err}"}


def breakdown(harness: DecodingHarness, prompt: torch.Tensor, new_tokens: int, repeats: int,
              profile_calls: int = 0) -> dict:
    device, block = harness.spec_runner.device, harness.proposer.block_size
    spec_runner, plain_runner, proposer = harness.spec_runner, harness.plain_runner, harness.proposer
    spec_graphs, plain_graphs = harness.spec_graphs, harness.plain_graphs
    with harness.fast():
        # Warm-up: compilation, graph capture, allocator; then one timed sequence each.
        generate(plain_runner, prompt, max_new_tokens=min(new_tokens, 3 * block), graphs=plain_graphs)
        generate(spec_runner, prompt, proposer=proposer, max_new_tokens=min(new_tokens, 3 * block),
                 graphs=spec_graphs)
        plain = generate(plain_runner, prompt, max_new_tokens=new_tokens, graphs=plain_graphs)
        spec = generate(spec_runner, prompt, proposer=proposer, max_new_tokens=new_tokens, graphs=spec_graphs)
        whole = {"speculative_ms_per_step": 1000 * spec.decode_s / len(spec.emitted),
                 "plain_ms_per_step": 1000 * plain.decode_s / plain.decode_tokens,
                 "speculative_steps": len(spec.emitted), "plain_steps": plain.decode_tokens,
                 "tau": spec.decode_tokens / len(spec.emitted),
                 "equal_outputs": spec.tokens == plain.tokens}

        # The inputs of a step after the first (its context: the features of a whole verified block), one
        # block past the prompt; each step function sets its caches from its inputs, so repeats are alike.
        position = torch.tensor(prompt.shape[1] + block, device=device)
        anchor = torch.tensor([plain.tokens[0]], device=device)
        valid = torch.tensor(block, device=device)
        ids = anchor.repeat(block)[None]  # token values do not change a step's time
        target_logits, context = spec_graphs.run("verify", spec_runner.forward, ids, position)
        draft_logits = spec_graphs.run("draft", proposer.propose, anchor, position, context, valid)[0]
        drafts = choose(draft_logits, GREEDY, None)[0]
        plain_logits = plain_graphs.run("decode", plain_runner.forward, anchor.view(1, 1), position)[0]

        def acceptance_and_sync():
            accepted, bonus = accept_greedy(drafts, target_logits[0])
            return step_outcome(accepted, drafts, bonus)

        parts = {
            "draft forward (graph)": lambda: spec_graphs.run("draft", proposer.propose, anchor, position, context,
                                                             valid),
            "drafts' argmax, block ids": lambda: block_ids(anchor, choose(draft_logits, GREEDY, None)[0]),
            "verify forward (graph)": lambda: spec_graphs.run("verify", spec_runner.forward, ids, position),
            "acceptance, host sync": acceptance_and_sync,
            "plain forward (graph)": lambda: plain_graphs.run("decode", plain_runner.forward, anchor.view(1, 1),
                                                              position),
            "plain argmax, host sync": lambda: int(choose(plain_logits[0, -1], GREEDY, None)[0]),
        }
        times = {name: timed(fn, repeats, device) for name, fn in parts.items()}
        # Which kernels the captured steps run, where their times differ more than their layers do.
        profiles = {name: profiled(parts[name], profile_calls, device, rows=30) for name in parts
                    if profile_calls and "(graph)" in name}
        # The captured steps' shapes: a graph that is not one chain of nodes may launch in time per node.
        graphs = {} if device.type != "cuda" else {
            "draft": captured_structure(lambda: proposer.propose(anchor, position, context, valid)),
            "verify": captured_structure(lambda: spec_runner.forward(ids, position)),
            "plain": captured_structure(lambda: plain_runner.forward(anchor.view(1, 1), position))}
    spec_parts = ["draft forward (graph)", "drafts' argmax, block ids", "verify forward (graph)",
                  "acceptance, host sync"]
    in_parts = sum(times[name]["back_to_back_ms"] for name in spec_parts)
    plain_parts = sum(times[name]["back_to_back_ms"] for name in ("plain forward (graph)", "plain argmax, host sync"))
    return {"whole_steps": whole, "parts": times, "profiles": profiles, "graphs": graphs,
            "speculative_step": {"in_parts_ms": in_parts, "remainder_ms": whole["speculative_ms_per_step"] - in_parts},
            "plain_step": {"in_parts_ms": plain_parts, "remainder_ms": whole["plain_ms_per_step"] - plain_parts}}


def measure(target: str, draft: Path, device: torch.device, dtype: torch.dtype, args: argparse.Namespace) -> dict:
    source, draft_config, target_config = check_pair(TargetConfig(name_or_path=target), draft, "--draft")
    if dtype == torch.float32:
        ieee_float32_dots()
    block = args.block or draft_config.block_size
    if not 2 <= block <= draft_config.block_size:
        raise UserError(f"--block {block} is outside 2..{draft_config.block_size}: the draft was trained for blocks "
                        f"of {draft_config.block_size}")
    if args.new_tokens < block:
        raise UserError(f"--new-tokens is {args.new_tokens}, shorter than the draft's block of {block}; give at "
                        f"least {block}")
    max_len = args.prompt_len + args.new_tokens + block + 1
    harness = DecodingHarness.load(source, draft, dtype=dtype, device=device, trust_remote_code=False,
                                   max_len=max_len, block=block, compile=None, cuda_graphs=True)
    generator = torch.Generator().manual_seed(args.seed)
    # Token ids below 1024 fall in no tokenizer's special range at the end of the vocabulary.
    prompt = torch.randint(0, min(target_config.vocab_size, 1024), (1, args.prompt_len), generator=generator)
    result = breakdown(harness, prompt.to(device), args.new_tokens, args.repeats, args.profile)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."), "block_size": block, "draft_block_size": draft_config.block_size,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "repeats": args.repeats, "max_len": max_len,
        "random_weights": args.random,
        "target_layers": target_config.num_hidden_layers, "draft_layers": draft_config.num_hidden_layers,
        "harness": {"compiled": harness.compiled, "target_attention": harness.attention,
                    "fused_projection_groups": harness.fused_projection_groups,
                    "flex_decode_attention": harness.flex_decode_attention,
                    "cuda_graphs": {"speculative": harness.spec_graphs.enabled,
                                    "plain": harness.plain_graphs.enabled}},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        **result,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="the target: a GGUF file, an HF folder or hub id")
    parser.add_argument("--draft", help="a draft folder (flashdraft draft-init or train wrote it)")
    parser.add_argument("--random", choices=sorted(SHAPES), help="in place of --target and --draft: random weights "
                        "of this shape")
    parser.add_argument("--block", type=int, default=None,
                        help="tokens a step verifies (evaluate's --block-size): default the draft's block")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bfloat16 on a GPU (the serving dtype), float32 on the CPU")
    parser.add_argument("--prompt-len", type=int, default=512, help="random prompt tokens (sets the cache length)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=200, help="calls of each part")
    parser.add_argument("--profile", type=int, default=0, metavar="CALLS",
                        help="also profile this many calls of each captured forward: kernels a call, top kernels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSON results file")
    args = parser.parse_args(argv)
    if args.random and (args.target or args.draft):
        parser.error("--random stands in for --target and --draft; give one or the other")
    if not args.random and not (args.target and args.draft):
        parser.error("give --target and --draft (or --random SHAPE)")
    command = " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])
    try:
        for flag, value, least in (("--prompt-len", args.prompt_len, 1), ("--new-tokens", args.new_tokens, 2),
                                   ("--repeats", args.repeats, 1), ("--profile", args.profile, 0)):
            if value < least:
                raise UserError(f"{flag} is {value}; give at least {least}")
        out = check_output_file(args.out, "--out")
        device = resolve_device(args.device)
        dtype = resolve_dtype(args.dtype, device)
        with tempfile.TemporaryDirectory() as scratch:
            target, draft = (write_random_pair(args.random, Path(scratch)) if args.random
                             else (args.target, Path(args.draft)))
            report = measure(str(target), draft, device, dtype, args) | {"command": command}
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_json(out, report)
    whole = report["whole_steps"]
    print(f"speculative step {whole['speculative_ms_per_step']:.3f} ms, plain step {whole['plain_ms_per_step']:.3f} ms "
          f"(ratio {whole['speculative_ms_per_step'] / whole['plain_ms_per_step']:.2f})")
    for name, t in report["parts"].items():
        print(f"  {name:28s} {t['back_to_back_ms']:8.3f} ms back to back, {t['issue_ms']:8.3f} to issue, "
              f"{t['alone_ms']:8.3f} alone")
    for name, profile in report["profiles"].items():
        print(f"{name}: {profile['device_events_per_call']:.0f} device events a call\n{profile['top']}")
    for name, shape in report["graphs"].items():
        print(f"{name} graph: {shape}")
    for step in ("speculative_step", "plain_step"):
        print(f"{step}: {report[step]['in_parts_ms']:.3f} ms in its parts, {report[step]['remainder_ms']:.3f} ms in none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
