"""The embedded backend: one-process GRPO training (CPU or one GPU), the KV-cached sampler, supervised
warm start, and turning samples into scored evidence rows. It knows a policy, a recipe and a reward
function object, never a stage or a task's internals."""
