"""The one error of the sandbox: ``SandboxError(message, label)``, the label being the candidate's failure label
(sandbox_timeout, sandbox_memory, sandbox_violation, sandbox_crash, sandbox_bad_output, sandbox_disk, ...).
Its message is bounded (it is stored and may reach an agent's prompt)."""

from __future__ import annotations

from evotrainer.contracts.text import bounded_text


class SandboxError(RuntimeError):
    def __init__(self, message: str, label: str):
        super().__init__(bounded_text(message))
        self.label = label
