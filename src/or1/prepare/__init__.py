"""`or1 prepare-data`: sources in, filtered train / validation files of or1 rows out.

spec (the YAML) -> sources (where rows come from) -> adapters (record schemas -> or1 rows) -> filters (verifiable),
dedup and decontamination -> difficulty (sampled solve counts, a resumable Ray job) -> pipeline (the steps in order)
-> ledger (what happened to every row: report.md, dropped.jsonl). The or1 row itself lives in `or1.data`.
"""
