"""AI for Training: SFT with turn-level error masking, CARE RL, DeepSpeed configs, checkpoints.

- `qpa.train.tiny`: tiny Qwen3 checkpoints (tokenizer trained on the suite's text), the local
  stand-in for real checkpoints;
- `qpa.train.warmup`: the loop's tiny checkpoint (tokenizer with macro tokens, induction
  warm-up);
- `qpa.train.greedy`: `evaluate` a local checkpoint (greedy episodes through the Harness, scored
  by `qpa.bench.evaluate`, diagnosed);
- `qpa.train.config`: run settings (`SFTConfig`, `DeepSpeedSettings`, `CheckpointSettings`,
  `MetricsSettings`) and their mapping to TRL;
- `qpa.train.sft`: `train_sft(config)` (TRL `SFTTrainer` on pre-tokenized, turn-masked data);
- `qpa.train.deepspeed`: DeepSpeed JSON from settings; rendezvous and launch commands for
  indexed Jobs;
- `qpa.train.checkpoint`: checkpoints in the artifact store (hashes, latest complete, restore);
- `qpa.train.metrics`: metrics JSONL log and Prometheus collectors shared by SFT and RL.

Importing `qpa.train` (or its config, deepspeed and checkpoint modules) never imports torch;
the trainers import it when they run.
"""

from qpa.train.config import CheckpointSettings, DeepSpeedSettings, MetricsSettings, SFTConfig

__all__ = ["CheckpointSettings", "DeepSpeedSettings", "MetricsSettings", "SFTConfig"]
