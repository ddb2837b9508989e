"""TRL's GRPOTrainer, trained from rollout-queue workers (docs/integrations/trl.md shows this file).

Start this script, then the workers, each in its own terminal (or pod). The script creates the
queue and feeds it the dataset; a worker started first waits for the queue (--wait-for-queue,
default 300 s, logged once) instead of exiting. Like every process of the project, it reads the
Redis URL and the queue from REDIS_URL and ROLLOUT_QUEUE (--url and --queue override them):

    export REDIS_URL=redis://localhost:6379/0 ROLLOUT_QUEUE=trl-digits
    python examples/trl_grpo.py --model ./tiny --output ./run
    rollout-queue worker --engine torch --model ./tiny --max-tokens 16 --temperature 1.0

Killed at any moment, run it again with --resume: TRL resumes from its last checkpoint and the
queue requeues the groups committed after it, so every group is trained exactly once (the log line
"restored the queue to the checkpoint ... requeued=N" says how many). ``--local`` runs TRL alone
(its own generation, no queue) for comparison.
"""

from __future__ import annotations

import argparse
import logging
import os

from rollout_queue import QueueConfig, RolloutQueue
from rollout_queue.demo.task import prompts
from rollout_queue.ops import logs

log = logging.getLogger("rollout_queue.examples.trl_grpo")


def digit_share(completions: list[str], **_: object) -> list[float]:
    """The user's own reward function, unchanged: share of non-space characters that are digits."""
    shares = []
    for text in completions:
        chars = [c for c in text if not c.isspace()]
        shares.append(sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0)
    return shares


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
                   help="Redis URL (env REDIS_URL)")
    p.add_argument("--queue", default=os.environ.get("ROLLOUT_QUEUE", "trl-digits"), help="queue name (env ROLLOUT_QUEUE)")
    p.add_argument("--model", required=True, help="a save_pretrained folder (model + tokenizer)")
    p.add_argument("--output", required=True, help="TRL's output_dir (checkpoints)")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--groups", type=int, default=4, help="prompt groups per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lease-timeout", type=float, default=60.0, help="seconds a killed trainer's lease stays out")
    p.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output")
    p.add_argument("--local", action="store_true", help="TRL alone: its own generation, no queue")
    args = p.parse_args()
    logs.configure()  # the project's log lines on stderr: what starts, what a resume requeued
    log.info("resuming" if args.resume else "starting", extra=logs.fields(queue=args.queue, output=args.output))

    with logs.progress(log, "importing torch, transformers and TRL"):  # tens of seconds on a small CPU
        # The adapter first: it silences TRL's vLLM version warning, which TRL gives as it is imported.
        from rollout_queue.integrations.trl import QueueGRPOTrainer  # isort: skip
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.trainer_utils import get_last_checkpoint
        from trl import GRPOConfig, GRPOTrainer
    with logs.progress(log, "loading the model", model=args.model):
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model)
    dataset = Dataset.from_list([{"prompt": text} for text in prompts(400)])
    config = GRPOConfig(
        output_dir=args.output, use_cpu=True, bf16=False, report_to=[], seed=0,
        num_generations=8, per_device_train_batch_size=8 * args.groups, max_completion_length=16,
        temperature=1.0, learning_rate=args.lr, lr_scheduler_type="constant", beta=0.0, max_steps=args.max_steps,
        save_steps=args.save_steps, logging_steps=1, dataloader_num_workers=0,
    )
    common = dict(model=model, reward_funcs=[digit_share], args=config, train_dataset=dataset,
                  processing_class=tokenizer)
    if args.local:
        trainer = GRPOTrainer(**common)
    else:
        # Admission control: a step trains `groups` groups per process and publishes a version, so the
        # workers may run at most max_staleness + 1 steps ahead (leave batch_groups out and the trainer
        # derives the same; batch_groups=None: no bound, every group further ahead goes stale).
        per_version = args.groups * int(os.environ.get("WORLD_SIZE", "1"))
        queue = RolloutQueue.from_url(args.url, args.queue, QueueConfig(lease_timeout_s=args.lease_timeout,
                                                                        max_staleness=4, batch_groups=per_version))
        trainer = QueueGRPOTrainer(**common, queue=queue)
    resume = get_last_checkpoint(args.output) if args.resume and os.path.isdir(args.output) else None
    log.info("training", extra=logs.fields(checkpoint=resume or "none (from step 0)", max_steps=args.max_steps))
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
