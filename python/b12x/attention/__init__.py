"""Attention-side ops: :mod:`b12x.attention.dsa_indexer`, the planned C4 sparse indexer."""
