"""The server's request and response path: tokenizer and detokenizer settings.

Each key is declared once, as a field of a frozen dataclass
(:func:`simcore.checks.key`): its default and its check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from simcore.checks import count, key, number, optional_count, parse_keys


@dataclass(frozen=True)
class TokenizationConfig:
    workers: int = key(1, count, doc="Tokenizer servers per worker (each a FIFO).", unit="servers")
    base_ms: float = key(0.0, number, doc="Fixed cost of tokenizing one request's prompt.")
    per_input_us: float = key(0.0, number, doc="Cost per prompt token.")

    @property
    def enabled(self) -> bool:
        return self.base_ms > 0 or self.per_input_us > 0


@dataclass(frozen=True)
class DetokenizationConfig:
    workers: int = key(
        1, count,
        doc="Detokenizer servers per worker (each a FIFO over the passes' outputs).",
        unit="servers",
    )
    base_ms: float = key(
        0.0, number,
        doc="Fixed cost of one detokenizer job (one pass's outputs on one server); 0 with the others: the stage is off.",
    )
    per_output_us: float = key(0.0, number, doc="Cost per output token in a job.")
    chunk_size: int | None = key(
        None, optional_count,
        doc="Split a server's outputs of one pass into jobs of at most this many (vLLM's output handler: 128); null: one job.",
        unit="tokens",
    )
    first_output_us: float = key(0.0, number, doc="Extra cost per request-first token in a job.")
    final_output_us: float = key(0.0, number, doc="Extra cost per request-final token in a job.")

    @property
    def enabled(self) -> bool:
        return (
            self.base_ms > 0
            or self.per_output_us > 0
            or self.first_output_us > 0
            or self.final_output_us > 0
        )


def parse_tokenization(raw: Mapping[str, Any], path: str = "tokenization") -> TokenizationConfig:
    """Check the ``tokenization`` section.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``tokenization`` tree.
    path : str
        Its dotted path, for messages.

    Returns
    -------
    TokenizationConfig
    """
    return parse_keys(TokenizationConfig, raw, path)


def parse_detokenization(raw: Mapping[str, Any], path: str = "detokenization") -> DetokenizationConfig:
    """Check the ``detokenization`` section.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``detokenization`` tree.
    path : str
        Its dotted path, for messages.

    Returns
    -------
    DetokenizationConfig
    """
    return parse_keys(DetokenizationConfig, raw, path)
