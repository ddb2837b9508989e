"""Scale-out: one logical queue over P partitions (Redis Cluster), and weighted fleets of queues.
"""
