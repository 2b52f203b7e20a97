"""Make colbert-ai 0.2.22's model class load under transformers 5.

``class_factory`` builds ``HF_ColBERT``, whose ``__init__`` ends with ``self.init_weights()``.
transformers 5 moved the bookkeeping that ``from_pretrained`` relies on (for instance
``all_tied_weights_keys``) into ``post_init()``, so loading fails with an AttributeError.
Calling ``post_init()`` after colbert-ai's ``__init__`` is what every transformers model does
and is harmless on 4.x, where it re-runs the same weight initialisation that
``from_pretrained`` then overwrites with the checkpoint's weights.
"""

from __future__ import annotations

import functools

__all__ = ["class_factory_with_post_init"]


def class_factory_with_post_init(original_class_factory):
    """Wrap colbert-ai's ``class_factory`` so the class it returns calls ``post_init()``.

    Args:
        original_class_factory: ``colbert.modeling.hf_colbert.class_factory``.

    Returns:
        A function with the same signature; ``__wrapped__`` is the original.
    """

    @functools.wraps(original_class_factory)
    def class_factory(name_or_path):
        upstream_class = original_class_factory(name_or_path)

        def __init__(self, config, colbert_config):
            upstream_class.__init__(self, config, colbert_config)
            self.post_init()

        # Same name, so saved configs and logs look exactly as with stock colbert-ai.
        return type(upstream_class.__name__, (upstream_class,), {"__init__": __init__,
                                                                 "__module__": upstream_class.__module__,
                                                                 "__qualname__": upstream_class.__qualname__})

    return class_factory
