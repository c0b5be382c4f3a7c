"""Agentic environments and the tools they expose to the policy (sandboxed Python, search, function calls)."""
