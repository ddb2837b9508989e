"""Tests of the trainer helpers, the producer, the compose file and the demo (issue 8)."""
