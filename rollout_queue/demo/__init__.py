"""``rollout-queue demo``: fully asynchronous GRPO on one machine, from one command.

Modules: ``main`` (set-up, engine choice, summary, ``--compare``), ``run`` (one run: producer, reaper,
worker processes, trainer, dashboard, worker kill, ledger check), ``grpo`` (the trainer loop, also
``rollout-queue train``), ``fleet`` (worker processes), ``dashboard`` (the live view), ``ledger``
(the closing check against Redis) and ``task`` (the toy task and its reward, imported by workers).
Nothing here is needed to use the queue; it shows the queue at work.
"""
