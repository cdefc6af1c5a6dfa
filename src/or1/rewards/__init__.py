"""Verifiable rewards: math answer verification and sandboxed code judging, behind one batch API."""
