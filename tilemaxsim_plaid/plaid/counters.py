"""What the plugin did in this process: searches, documents scored, fallbacks and their reasons.

The scoring code counts on the host only: a count that lives on the device (a candidate list's
validity mask) is kept as a tensor and read when :func:`stats` is called, so counting adds no
host sync to a search.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

__all__ = ["PluginStats", "stats", "count_search", "count_fallback"]


@dataclasses.dataclass(frozen=True)
class PluginStats:
    """Counts since the process started or since ``stats(reset=True)``.

    Attributes:
        searches: queries the plugin scored (``IndexScorer.rank``, ``Searcher.search_all``,
            ``IndexScorer.score_pids``, ``colbert_score_packed``), one per query.
        documents_scored: documents those queries scored exactly (PLAID's stage 4).
        fallbacks: ``{reason: calls}``: calls handed to colbert-ai's own code or run on a
            slower path of the plugin, by reason.
    """

    searches: int = 0
    documents_scored: int = 0
    fallbacks: dict[str, int] = dataclasses.field(default_factory=dict)


_lock = threading.Lock()
_searches = 0
_documents = 0
_pending_documents: list = []  # device scalars (tensors) not yet read
_fallbacks: collections.Counter = collections.Counter()
# Device counts folded into one tensor past this many, so the list stays short between reads.
_MAX_PENDING = 256


def count_search(documents=0) -> None:
    """One query scored, with ``documents`` documents (an int, or a 0-d tensor; one on a GPU
    is kept unread until :func:`stats`)."""
    global _searches, _documents
    with _lock:
        _searches += 1
        if not getattr(documents, "is_cuda", False):
            _documents += int(documents)
            return
        _pending_documents.append(documents)
        if len(_pending_documents) > _MAX_PENDING:
            total = sum(_pending_documents[1:], _pending_documents[0])
            _pending_documents[:] = [total]


def count_fallback(reason: str) -> None:
    """One call took a fallback, for ``reason`` (a fixed sentence, not a per-call message)."""
    with _lock:
        _fallbacks[reason] += 1


def stats(reset: bool = False) -> PluginStats:
    """The plugin's counts (see :class:`PluginStats`); ``reset=True`` also sets them to zero.

    Reading reads the device counts still pending (one sync per device that has any).
    """
    global _searches, _documents
    with _lock:
        documents = _documents + sum(int(count) for count in _pending_documents)
        result = PluginStats(_searches, documents, dict(_fallbacks))
        _documents, _pending_documents[:] = documents, []
        if reset:
            _searches = _documents = 0
            _fallbacks.clear()
        return result
