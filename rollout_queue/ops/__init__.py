"""Operator tools: read-only views, repair actions, metrics, ACL roles, the reaper, structured logs.
"""
