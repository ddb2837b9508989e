"""Development tools: private redis/valkey servers and clusters, the chaos harness.
"""
