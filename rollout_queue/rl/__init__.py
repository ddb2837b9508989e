"""RL helpers: the trainer loop helpers and the dataset producer.
"""
