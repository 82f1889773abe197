"""TOPAS: task-oriented, prefix-aware scheduling of multi-agent LLM workflows."""

# The policy registry imports the heuristic, which imports the policy base classes:
# loading the registry first makes ``import topas.heuristic`` (or any submodule) work
# in any order.
import topas.policies  # noqa: F401
