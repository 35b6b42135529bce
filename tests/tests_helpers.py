"""Helpers importable by tests (conftest fixtures aside)."""

from __future__ import annotations

from rank_dataset._synthetic import imagenet_line

__all__ = ["imagenet_line"]
