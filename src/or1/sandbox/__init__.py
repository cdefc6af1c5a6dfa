"""Isolated execution of untrusted programs for the code reward.

protocol (limits, requests, replies, frames) -> runner (inside the sandbox) -> local (bubblewrap) / docker_backend
(containers) -> pool (warm slots, ordered batches) -> check (`or1 sandbox check`, probes from probes). Threat model:
sandbox/README.md at the repository root.
"""
