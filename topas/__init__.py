"""TOPAS: task-oriented, prefix-aware scheduling of multi-agent LLM workflows."""

# The policy registry imports TOPAS's modules, which import the policy base classes:
# loading the registry first makes ``import topas.policies.search`` (or any submodule)
# work in any order.
import topas.policies  # noqa: F401
