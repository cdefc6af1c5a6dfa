"""HybridFlow core: the Batch protocol (`batch`, `columns`), the Worker base and dispatch modes (`worker`,
`dispatch`), resource pools and Ray worker groups (`resource_pool`, `worker_group`), starting Ray (`cluster`).

Import from the modules: `or1 train` starts Ray through `or1.hybrid.cluster` (Ray only) while a thread imports torch
and the trainer, so this package imports nothing by itself.
"""
