"""Under which keyword a transformers module's forward takes its cache.

transformers renamed it: models and attention layers took `past_key_values=` and Mamba mixers
`cache_params=`; newer releases take `cache=` everywhere (the old names stay as deprecated aliases for
a while). A cache passed under a name the forward does not know falls into its `**kwargs` and is
silently ignored, so the name is read from the callee's signature, not guessed from a version.
"""

from __future__ import annotations

import inspect

from torch import nn

# Newest first: a forward that still accepts an old name through a deprecation wrapper exposes the new one.
CACHE_KWARGS = ("cache", "past_key_values", "cache_params")


def cache_kwarg(module: nn.Module) -> str | None:
    """The name of the cache parameter of `module.forward`, None if it takes no cache."""
    parameters = inspect.signature(module.forward).parameters
    return next((name for name in CACHE_KWARGS if name in parameters), None)
