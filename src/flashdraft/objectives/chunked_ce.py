"""Weighted cross-entropy through a frozen LM head without materialising [tokens x vocab] logits.

The head runs over chunks of tokens. Because the loss is a scalar and the head is frozen, the gradient
with respect to the hidden states is fully known once a chunk's logits exist: (softmax - onehot) * w @ W.
So each chunk's gradient is computed right there, in the forward, and its logits are dropped; backward
only scales the stored [tokens x hidden] gradient by the incoming scalar. That is the same memory bound
as recomputing the logits in backward (one chunk of logits alive at a time) with one matmul per chunk
less (the fused linear-cross-entropy trick).
"""

from __future__ import annotations

import functools

import torch
from torch.nn import functional as F


def _head_chunk(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, with_grad: bool):
    """Weighted CE sum, argmax and (if `with_grad`) the logits' gradient w * (softmax - onehot), in the
    logits' dtype, for one chunk. Compiled on GPUs into one reduction and one pointwise pass over the
    chunk (eager, it is ~8 passes over a float32 copy: at a 152k vocab that is ~15 GB per 2k tokens)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    picked = x.gather(1, labels[:, None])[:, 0]
    total = ((lse - picked) * weights).sum()
    preds = x.argmax(dim=-1)
    if not with_grad:
        return total, preds, None
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == labels[:, None]
    scores = (torch.exp(x - lse[:, None]) - onehot.float()) * weights[:, None]
    return total, preds, scores.to(logits.dtype)


@functools.cache
def _compiled_head_chunk():
    return torch.compile(_head_chunk, dynamic=True)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, weights, chunk_size, compute_grad):
        head_chunk = _compiled_head_chunk() if hidden.is_cuda else _head_chunk
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        preds = torch.empty_like(labels)
        grad = torch.empty_like(hidden) if compute_grad else None
        for start in range(0, hidden.shape[0], chunk_size):
            end = start + chunk_size
            logits = hidden[start:end] @ weight.t()
            part, preds[start:end], scores = head_chunk(
                logits, labels[start:end], weights[start:end].float(), compute_grad
            )
            total += part
            if compute_grad:
                grad[start:end] = (scores @ weight).to(hidden.dtype)
        ctx.save_for_backward(grad if compute_grad else hidden.new_empty(0))
        ctx.mark_non_differentiable(preds)
        return total, preds

    @staticmethod
    def backward(ctx, grad_total, _grad_preds):
        (grad,) = ctx.saved_tensors
        return grad * grad_total.to(grad.dtype), None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    chunk_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_i weights[i] * CE(hidden[i] @ weight.T, labels[i]) (float32) and the argmax predictions.

    hidden [T, H]; weight [V, H], the frozen head (no gradient flows to it); labels [T]; weights [T].
    `chunk_size` > 0 runs the head over that many tokens at a time (see the module docstring);
    0 computes the full [T, V] logits with plain autograd (the reference, and the naive baseline).
    """
    if weight.requires_grad:
        raise ValueError("linear_cross_entropy expects a frozen LM head (weight.requires_grad is True)")
    if chunk_size <= 0:
        logits = (hidden @ weight.t()).float()
        losses = F.cross_entropy(logits, labels, reduction="none")
        return (losses * weights.float()).sum(), logits.argmax(dim=-1)
    compute_grad = torch.is_grad_enabled() and hidden.requires_grad
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, labels, weights, chunk_size, compute_grad)
