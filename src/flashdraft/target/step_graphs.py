"""CUDA-graph replay of the fixed-shape decoding steps (draft forward, block verify, 1-token decode).

At batch 1 a step is a few hundred small kernels, so launch overhead, not arithmetic, sets the speed;
replaying a captured graph removes it. A step function must be idempotent given its inputs (the
target runner and the draft proposer set their cache lengths and states from the inputs first), so
the warm-up runs before capture change nothing. Off the GPU, or when capture fails (a model that
syncs with the host inside its forward, e.g. data-dependent expert routing), steps run eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

WARMUP_RUNS = 2


class StepGraphs:
    """Captures each (step name, input shapes) once, then replays it with new input values."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._graphs: dict[tuple, tuple[list[torch.Tensor], object, Callable[[], None]]] = {}
        self._pool = None

    @classmethod
    def for_device(cls, device: torch.device, enabled: bool = True) -> StepGraphs:
        return cls(enabled=enabled and device.type == "cuda")

    def run(self, name: str, fn: Callable, *args: torch.Tensor, graph: bool = True):
        if not (self.enabled and graph):
            return fn(*args)
        # One graph per step, owner (a runner, a proposer: held, so its identity stays unique) and shapes.
        key = (name, getattr(fn, "__self__", fn), *((a.shape, a.dtype) for a in args))
        entry = self._graphs.get(key)
        if entry is None:
            try:
                entry = self._capture(fn, args)
            except RuntimeError as err:
                log.warning("CUDA graph capture of %r failed, running eagerly from now on: %s", name, err)
                self.enabled = False
                return fn(*args)
            self._graphs[key] = entry
        static_inputs, outputs, replay = entry
        for static, value in zip(static_inputs, args):
            static.copy_(value)
        replay()
        return outputs

    def _capture(self, fn: Callable, args: tuple[torch.Tensor, ...]):
        """(static inputs, static outputs, replay): replay() recomputes the outputs from the inputs."""
        static_inputs = [a.clone() for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn(*static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph, pool=self._pool):
            outputs = fn(*static_inputs)
        return static_inputs, outputs, cuda_graph.replay
