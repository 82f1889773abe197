"""TOPAS inside SGLang 0.5.23 (work in progress; see ../README.md)."""

SGLANG_VERSION = "0.5.23"
"""The SGLang release the plugin is written and tested against."""
