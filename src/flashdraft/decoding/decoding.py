"""Batch-1 decoding on one harness: speculative (draft + verify) and plain autoregressive, `generate`.

Both share the target runner (preallocated cache, fixed-shape steps, optional CUDA graphs) so the
speedup compares like with like. Per step the host waits once, for the few integers that decide the
accept length and the emitted tokens. Times exclude the prefill and synchronise the device.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from flashdraft.data.sampling import Sampling, choose, sampling_probs
from flashdraft.decoding.proposers import Proposer
from flashdraft.decoding.sampling import accept_greedy, accept_sampled
from flashdraft.decoding.target_runner import TargetRunner
from flashdraft.errors import UserError
from flashdraft.target.step_graphs import StepGraphs


@dataclass
class Generation:
    """One decoded sequence. `tokens` are the new tokens, the first one from the prefill."""

    tokens: list[int]
    prefill_s: float
    decode_s: float
    # Speculative only, one entry per verify step: tokens emitted (accepted drafts + bonus, cut at the
    # end or a stop token: the tau of that step) and drafts accepted (uncut: per-slot acceptance).
    emitted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    @property
    def decode_tokens(self) -> int:
        """Tokens produced after the prefill's, the numerator of decode tokens/s."""
        return max(len(self.tokens) - 1, 0)


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _finish(tokens: list[int], new: list[int], max_new_tokens: int, stop_ids: Collection[int]) -> bool:
    """Append `new` up to the budget or the first stop token (kept); True when decoding is over."""
    for token in new:
        tokens.append(token)
        if token in stop_ids or len(tokens) >= max_new_tokens:
            return True
    return False



def block_ids(anchor: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """[1, B]: the ids a verify reads, the anchor then the B-1 drafts."""
    return torch.cat([anchor, drafts])[None]


def step_outcome(accepted: torch.Tensor, drafts: torch.Tensor, bonus: torch.Tensor) -> tuple[int, list[int]]:
    """(drafts accepted, the tokens the step emits: those drafts, then the bonus) through the one host sync of
    a speculative step."""
    host = torch.cat([accepted.view(1), drafts, bonus.view(1)]).tolist()
    return host[0], host[1 : 1 + host[0]] + [host[-1]]


def _prefill(
    runner: TargetRunner,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    params: Sampling,
    stop_ids: Collection[int],
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, Generation, bool, float]:
    """The opening both loops share: prefill the prompt (timed) and choose the first new token.

    Returns that token [1], the prefill's context features, the generation so far (prefill time set),
    whether decoding is already over, and the clock at the prefill's end (where decode time starts).
    """
    if max_new_tokens <= 0:
        raise UserError(f"max-new-tokens must be > 0, got {max_new_tokens}")
    t0 = _sync(runner.device)
    logits, context = runner.prefill(prompt_ids)
    first = choose(logits, params, generator)[0].view(1)
    tokens: list[int] = []
    done = _finish(tokens, [int(first)], max_new_tokens, stop_ids)
    t1 = _sync(runner.device)
    return first, context, Generation(tokens, prefill_s=t1 - t0, decode_s=0.0), done, t1


@torch.no_grad()
def generate(
    runner: TargetRunner,
    prompt_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    proposer: Proposer | None = None,
    params: Sampling = Sampling(),
    stop_ids: Collection[int] = (),
    generator: torch.Generator | None = None,
    graphs: StepGraphs | None = None,
) -> Generation:
    """Decode up to `max_new_tokens` after the prompt: plain decoding (one token per target forward), or
    with a `proposer` speculative decoding (per step one draft forward proposes B-1 tokens, one target
    forward verifies them)."""
    token, context, result, done, t1 = _prefill(runner, prompt_ids, max_new_tokens, params, stop_ids, generator)
    if not done:
        loop = _Loop(runner, result, max_new_tokens, params, stop_ids, generator, graphs or StepGraphs(enabled=False))
        if proposer is None:
            loop.plain(prompt_ids.shape[1], token)
        else:
            loop.speculative(proposer, prompt_ids.shape[1], token, context)
    result.decode_s = _sync(runner.device) - t1
    return result


@dataclass
class _Loop:
    """What the decoding steps of one sequence share."""

    runner: TargetRunner
    result: Generation
    max_new_tokens: int
    params: Sampling
    stop_ids: Collection[int]
    generator: torch.Generator | None
    graphs: StepGraphs

    def plain(self, start: int, token: torch.Tensor) -> None:
        runner, graphs, params, generator = self.runner, self.graphs, self.params, self.generator
        position = torch.tensor(start, device=runner.device)
        done = False
        while not done:
            position.fill_(start)
            logits, _ = graphs.run("decode", runner.forward, token.view(1, 1), position)
            token = choose(logits[0, -1], params, generator)[0]
            runner.commit(1, 1, graphs)
            start += 1
            done = _finish(self.result.tokens, [int(token)], self.max_new_tokens, self.stop_ids)

    def speculative(self, proposer: Proposer, start: int, anchor: torch.Tensor, context: torch.Tensor) -> None:
        runner, graphs, params, generator = self.runner, self.graphs, self.params, self.generator
        result, max_new_tokens, stop_ids, device = self.result, self.max_new_tokens, self.stop_ids, runner.device
        block = proposer.block_size
        tokens = result.tokens
        proposer.reset(runner.max_len)
        position = torch.tensor(start, device=device)
        valid = torch.tensor(start, device=device)
        done = False
        while not done:
            position.fill_(start)
            # The first context is the prompt (any length); later ones are a whole block: graphable.
            draft_logits = graphs.run(
                "draft", proposer.propose, anchor, position, context, valid, graph=context.shape[1] == block
            )[0]
            drafts, draft_probs = choose(draft_logits, params, generator)
            target_logits, features = graphs.run("verify", runner.forward, block_ids(anchor, drafts), position)
            if params.greedy:
                accepted, bonus = accept_greedy(drafts, target_logits[0])
            else:
                target_probs = sampling_probs(target_logits[0], params)
                accepted, bonus = accept_sampled(drafts, draft_probs, target_probs, generator)
            n_acc, new = step_outcome(accepted, drafts, bonus)
            runner.commit(n_acc + 1, block, graphs)
            before = len(tokens)
            done = _finish(tokens, new, max_new_tokens, stop_ids)
            result.emitted.append(len(tokens) - before)
            result.accepted.append(n_acc)
            context = features
            valid.fill_(n_acc + 1)
            start += n_acc + 1
            anchor = bonus.view(1)
