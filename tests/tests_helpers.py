"""Helpers importable by tests (conftest fixtures aside)."""

from __future__ import annotations


def imagenet_line(i: int) -> str:
    """The i-th line of a synthetic ImageNet-like meta file."""
    label = (i * 7919) % 1000
    return f"train/n{label:08d}/n{label:08d}_{i}.JPEG {label}"
