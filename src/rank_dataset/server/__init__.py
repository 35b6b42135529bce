"""The meta server: one process holds the meta files and serves every rank its shard over HTTP. The wire
protocol, the app, its limits, connection guards and shared passes, the local launcher and the HTTP
transport.

Imports :mod:`rank_dataset.files`, :mod:`rank_dataset.plan` and :mod:`rank_dataset.core`.
"""
