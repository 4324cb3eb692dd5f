"""Strata from Python: its engine (`strata.LLM`), its CPU expert kernels (`strata.ops`) and
its server (`python -m strata serve`). See docs/python.md."""

from strata import ops
from strata._strata import LLM, CompletionOutput, RequestOutput, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "ops"]
