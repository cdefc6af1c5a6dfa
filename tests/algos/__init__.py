"""Tests of or1.algos (a package so their basenames cannot clash with other test folders)."""
