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
    workers: int = key(1, count)
    base_ms: float = key(0.0, number)
    per_input_us: float = key(0.0, number)

    @property
    def enabled(self) -> bool:
        return self.base_ms > 0 or self.per_input_us > 0


@dataclass(frozen=True)
class DetokenizationConfig:
    workers: int = key(1, count)
    base_ms: float = key(0.0, number)
    per_output_us: float = key(0.0, number)
    chunk_size: int | None = key(None, optional_count)
    first_output_us: float = key(0.0, number)
    final_output_us: float = key(0.0, number)

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
