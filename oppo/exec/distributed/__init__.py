"""Roles on their own processes and devices: Ray placement of workers and actor groups, the asynchronous pipeline and
its rollout workers (the only executor modules that import Ray).
"""
