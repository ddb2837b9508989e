"""Drivers: the I/O around the sans-IO core (redis-py connections, retries, durable WAITs).
"""
