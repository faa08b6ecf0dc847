"""Where untrusted code runs: candidate harness code (reward, curriculum, diagnostics) and, in the code
and agentic domains, policy-written programs. ``runner`` starts the limited worker processes and collects
their results as files (never pickle); ``worker`` is the process-side entry point."""
