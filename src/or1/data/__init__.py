"""The or1 row and where rows come from: schema and readers, the benchmark registry and record converters, and the
synthetic tiny world. Preparing a training set from sources (filters, dedup, difficulty) is `or1.prepare`."""
