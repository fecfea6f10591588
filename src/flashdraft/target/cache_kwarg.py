"""Under which keyword a transformers module's forward takes its cache.

transformers renamed it: models and attention layers took `past_key_values=` and Mamba mixers
`cache_params=`; newer releases take `cache=` everywhere (the old names stay as deprecated aliases for
a while). A cache passed under a name the forward does not know falls into its `**kwargs` and is
silently ignored, so the name is read from the callee's signature, not guessed from a version.
"""

from __future__ import annotations

import inspect

from torch import nn

from flashdraft.errors import UserError

# Newest first: a forward that still accepts an old name through a deprecation wrapper exposes the new one.
CACHE_KWARGS = ("cache", "past_key_values", "cache_params")


def cache_kwarg(module: nn.Module) -> str | None:
    """The name of the cache parameter of `module.forward`; None if the forward cannot take a cache."""
    parameters = inspect.signature(module.forward).parameters
    name = next((name for name in CACHE_KWARGS if name in parameters), None)
    if name is None and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        # transformers 5.15 wraps the Mamba mixers' forward in a decorator that hides its signature.
        raise UserError(
            f"cannot tell under which name {type(module).__name__}.forward takes its cache: its signature is "
            "hidden by a wrapper (transformers 5.15 does this to Mamba mixers; 5.16 and later do not), so "
            'speculative decoding of this target needs a newer transformers: pip install -U "transformers>=5.24"'
        )
    return name
